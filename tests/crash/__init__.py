"""The crash-point conformance matrix (issue 11): kill a real ``fencectl run`` at each named
crash point (``fencing.crashpoints``), start a fresh process against the same PostgreSQL and
Kafka, drain, and judge the outcome with the reference oracle, per group protocol.

- ``plans``: one ``CellPlan`` per point (how worker A is armed and brought to it).
- ``cell``: runs one cell against real services, phase by phase, each with a deadline.
- ``facts`` / ``verdict``: what is read back from PostgreSQL, and the pure judgement of it.
- ``report``: the printed matrix, the JSON under ``artifacts/crash-matrix/``.
- ``broken_worker``: a deliberately broken successor, to show the matrix can fail.

``tests/integration/test_crash_matrix.py`` runs it: ``make test`` one protocol per point
(rotating), ``make crash-matrix`` every point under every protocol.
"""
