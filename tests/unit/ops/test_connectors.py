"""``ops.stack.connectors.failed``: which status answers of Kafka Connect's REST API make
``restart_failed`` restart a connector's tasks (the shape of ``GET
/connectors/NAME/status``, as Kafka Connect 4.1 answers it)."""

from __future__ import annotations

from ops.stack.connectors import failed


def _status(connector: str, *tasks: str) -> dict[str, object]:
    return {"name": "shop", "connector": {"state": connector, "worker_id": "127.0.0.1:18083"},
            "tasks": [{"id": i, "state": s, "worker_id": "127.0.0.1:18083",
                       **({"trace": "io.debezium.DebeziumException: Couldn't get timestamp "
                                    "utils from underlying connection"}
                          if s == "FAILED" else {})}
                      for i, s in enumerate(tasks)], "type": "source"}


def test_a_failed_task_or_connector_is_failed() -> None:
    assert failed(_status("RUNNING", "FAILED"))
    assert failed(_status("RUNNING", "RUNNING", "FAILED"))
    assert failed(_status("FAILED"))


def test_running_paused_or_restarting_is_not() -> None:
    assert not failed(_status("RUNNING", "RUNNING"))
    assert not failed(_status("PAUSED", "PAUSED"))
    assert not failed(_status("RUNNING", "RESTARTING"))
    assert not failed(_status("RUNNING"))          # no task yet
    assert not failed({"name": "shop", "tasks": []})
