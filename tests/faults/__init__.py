"""Kafka faults on the three-node cluster (issue 24): broker, controller and coordinator kills,
rolling restarts, a cluster without quorum, static membership, per group protocol.

- ``group``: one consumer group of real ``fencectl run`` members over a backlog on the
  cluster, and what is read back (frontiers, applications per offset, the oracle, Kafka's
  own lag), with bounded waits.
- ``report``: each scenario's outcome as one JSON line under ``artifacts/kafka-faults/``;
  ``python -m tests.faults.report`` renders the fault x protocol table of
  ``docs/kafka-failures.md`` from those lines.

``tests/integration/test_kafka_faults.py`` and ``test_static_membership.py`` run them:
``make test-kafka-faults`` every scenario under every protocol, ``make test`` the
coordinator kill and the rolling restart under one protocol (rotating by day).
"""
