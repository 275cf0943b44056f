"""``FENCE_KAFKA_CONFIG``: the librdkafka properties every command's Kafka clients take from a
file, so TLS and SASL secrets never appear in argv; -X wins over the file for ``fencectl
run``; a mistake names the file (and the line), never a value."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumer.config import KAFKA_CONFIG_ENV, client_properties, kafka_settings
from consumer.kafka.adapter import check_consumer_settings, checked_client_properties
from fencing.errors import ConfigError
from ops import cli
from ops.commands.run import config_from_args

SECRET = "s3cr3t-Passw0rd"
BASE = {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "FENCE_DSN": "postgresql://x@h/d"}


def _file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return {KAFKA_CONFIG_ENV: str(path)}


def test_lines_comments_and_blanks(tmp_path: Path) -> None:
    env = _file(tmp_path, "# TLS and SASL\n\nsecurity.protocol = SASL_SSL\n"
                          f"sasl.mechanisms=SCRAM-SHA-512\nsasl.password={SECRET}=x\n")
    assert client_properties(env) == {"security.protocol": "SASL_SSL",
                                      "sasl.mechanisms": "SCRAM-SHA-512",
                                      "sasl.password": f"{SECRET}=x"}
    assert client_properties({}) == {}


def test_a_bad_line_or_file_names_the_file_not_the_value(tmp_path: Path) -> None:
    env = _file(tmp_path, f"sasl.username=app\n{SECRET}\n")
    with pytest.raises(ConfigError) as bad:
        client_properties(env)
    assert str(bad.value) == f"{KAFKA_CONFIG_ENV} {env[KAFKA_CONFIG_ENV]}: line 2 is not key=value"
    missing = {KAFKA_CONFIG_ENV: str(tmp_path / "none.properties")}
    with pytest.raises(ConfigError, match=r"none.properties: cannot read it \(No such file"):
        client_properties(missing)


def test_the_worker_takes_the_file_and_x_wins(tmp_path: Path) -> None:
    env = {**BASE, **_file(tmp_path, "client.id=from-file\nsocket.keepalive.enable=true\n")}
    args = cli.build_parser().parse_args(["run", "--topic", "t", "--group", "g",
                                          "-X", "client.id=from-flag"])
    settings = kafka_settings(config_from_args(args, env))
    assert settings["client.id"] == "from-flag"
    assert settings["socket.keepalive.enable"] == "true"
    check_consumer_settings(settings)  # librdkafka takes them


def test_the_file_is_checked_like_a_worker_s_settings(tmp_path: Path) -> None:
    env = _file(tmp_path, "security.protocol=bogus\n")
    with pytest.raises(ConfigError) as refused:
        checked_client_properties(env)
    assert str(refused.value) == (f"{KAFKA_CONFIG_ENV} {env[KAFKA_CONFIG_ENV]}: librdkafka "
                                  'refused it: Invalid value "bogus" for configuration '
                                  'property "security.protocol"')
    args = cli.build_parser().parse_args(["run", "--topic", "t", "--group", "g"])
    with pytest.raises(ConfigError, match="FENCE_KAFKA_CONFIG's file"):
        check_consumer_settings(kafka_settings(config_from_args(args, {**BASE, **env})))


def test_the_file_cannot_set_what_the_worker_owns(tmp_path: Path) -> None:
    env = {**BASE, **_file(tmp_path, "enable.auto.commit=true\n")}
    args = cli.build_parser().parse_args(["run", "--topic", "t", "--group", "g"])
    with pytest.raises(ConfigError, match=r"enable\.auto\.commit=true conflicts with the worker"):
        kafka_settings(config_from_args(args, env))
