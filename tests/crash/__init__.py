"""The crash-point conformance matrix by family (issues 11 and 29): kill a real process (a
``fencectl run`` worker, or an operator tool) at each named crash point
(``fencing.crashpoints``) its family reaches, recover against the same PostgreSQL and Kafka,
and judge the outcome with the family's oracle, per group protocol.

- ``families``: the families (reference handler, table sink, failing handler, quarantine
  replay, reset), their points and the cells ``make test`` runs.
- ``plans``: one ``CellPlan`` per point (how the process is armed and brought to it).
- ``cell``: runs one cell of a worker family, phase by phase, each with a deadline;
  ``tool_cell`` one cell of a tool family.
- ``facts`` / ``verdict`` / ``oracles``: what is read back from PostgreSQL, and the pure
  judgement of it.
- ``report``: the printed matrix, the JSON under ``artifacts/crash-matrix/``.
- ``broken_worker``: a deliberately broken successor, to show the matrix can fail.

``tests/integration/test_crash_matrix.py`` runs it: ``make test`` the reference family's
every point under one protocol (rotating) and one cell of every other family, ``make
crash-matrix`` every family's every point under every protocol.
"""
