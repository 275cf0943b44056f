"""The schema registry of the local stack: a Java >= 21 found on its own (or a message saying
how to get one), loopback ports, the URL ``stack env`` exports."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.stack import registry
from ops.stack.config import SERVICE_ENV, StackError, connection_env, settings_from

JVMS = sorted(Path("/usr/lib/jvm").glob("*/bin/java"))


def _majors() -> dict[str, int | None]:
    return {str(j): registry.java_major(str(j)) for j in JVMS}


def test_java_major_reads_the_version_a_java_reports() -> None:
    majors = _majors()
    if not majors:
        pytest.skip("no JDK under /usr/lib/jvm")
    assert all(m is None or m >= 8 for m in majors.values()), majors
    assert registry.java_major("/nonexistent/java") is None


def test_java_binary_finds_a_java_21_when_path_and_java_home_hold_an_older_one(
        tmp_path: Path) -> None:
    majors = _majors()
    old = [j for j, m in majors.items() if m is not None and m < 21]
    new = [j for j, m in majors.items() if m is not None and m >= 21]
    if not old or not new:
        pytest.skip("needs a Java < 21 and a Java >= 21 under /usr/lib/jvm")
    env = {"PATH": str(Path(old[0]).parent), "JAVA_HOME": str(Path(old[0]).parents[1])}
    got = registry.java_binary(env)
    assert got in new and majors[got] == max(m for m in majors.values() if m is not None)
    # the user's own Java >= 21 (JAVA_HOME) wins over the newest installed one
    assert registry.java_binary({"PATH": "", "JAVA_HOME": str(Path(new[0]).parents[1])}) \
        == new[0]


def test_without_a_java_21_the_error_says_what_was_found_and_how_to_get_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = [j for j, m in _majors().items() if m is not None and m < 21]
    if not old:
        pytest.skip("needs a Java < 21 under /usr/lib/jvm")
    monkeypatch.setattr(registry, "_JVM_DIR", tmp_path / "no-jvms")
    with pytest.raises(StackError) as info:
        registry.java_binary({"PATH": str(Path(old[0]).parent), "JAVA_HOME": ""})
    message = str(info.value)
    assert "needs Java 21 or newer" in message and f"{old[0]} (Java " in message
    assert "openjdk-21-jre-headless" in message and "JAVA_HOME" in message


def test_registry_ports_are_overridable_loopback_and_stack_env_exports_its_url() -> None:
    s = settings_from({"HOME": "/home/u", "FENCE_SCHEMA_REGISTRY_PORT": "24081",
                       "FENCE_SCHEMA_REGISTRY_MANAGEMENT_PORT": "24082"})
    assert (s.ports.schema_registry, s.ports.schema_registry_management) == (24081, 24082)
    assert registry.url(s) == "http://127.0.0.1:24081/apis/ccompat/v7"
    env = connection_env(s.ports, pg_password="pw")
    assert env["SCHEMA_REGISTRY_URL"] == registry.url(s) and "SCHEMA_REGISTRY_URL" in SERVICE_ENV
    defaults = settings_from({"HOME": "/home/u"}).ports
    assert (defaults.schema_registry, defaults.schema_registry_management) == (18081, 18082)
    assert registry.marker(s).startswith("-Dfenceworker.stack=")
    assert registry.ARTIFACT == "io.apicurio:apicurio-registry-app:3.3.3:tar.gz:all"
