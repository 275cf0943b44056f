"""compose/docker-compose.yml parses with the Docker Compose client where it is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ops.stack.config import SERVICE_ENV

COMPOSE_FILE = Path(__file__).resolve().parents[3] / "compose" / "docker-compose.yml"


def _compose_argv() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def test_compose_file_names_the_stack_env_variables() -> None:
    text = COMPOSE_FILE.read_text()
    for name in SERVICE_ENV:
        assert f"export {name}=" in text, name
        assert f"  {name}: " in text, name


def test_compose_config_parses() -> None:
    argv = _compose_argv()
    if argv is None:
        pytest.skip("no Docker Compose client (docker compose / docker-compose) installed")
    done = subprocess.run(
        [*argv, "-f", str(COMPOSE_FILE), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)
    assert set(config["services"]) >= {"redpanda", "postgres", "jaeger"}
    published = {
        (p["host_ip"], p["published"])
        for svc in config["services"].values()
        for p in svc.get("ports", [])
    }
    assert {h for h, _p in published} == {"127.0.0.1"}
    assert {p for _h, p in published} >= {"19092", "55432", "4317", "16686"}
