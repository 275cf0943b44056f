"""Which group protocol each protocol-parametrized test runs under in ``make test``.

Rules
- A test parametrized by ``setup`` over ``tests.integration.workers.GROUP_SETUPS`` proves a
  behaviour on eager-range, cooperative-sticky and KIP-848 groups. ``make test-protocols``
  (``FENCE_ALL_PROTOCOLS=full``) runs every protocol of every such test; ``make test`` runs
  one protocol per test so the suite stays under its time limit.
- The one protocol rotates over the tests like the crash matrix's points: the tests
  (function and its other parameters, e.g. the zombie test's mode) are sorted by id and the
  i-th runs under protocol i mod 3, so all three protocols appear in every ``make test``.
  A test that names only some protocols keeps one of those.
- Pure: takes ``(test key, protocol name)`` pairs, returns the pairs to run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

__all__ = ["PROTOCOLS", "one_protocol_each"]

PROTOCOLS = ("eager-range", "cooperative-sticky", "kip848-consumer")


def one_protocol_each(cases: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """The ``(key, protocol)`` cases ``make test`` runs: one per key, rotating by key order."""
    by_key: dict[str, set[str]] = defaultdict(set)
    for key, protocol in cases:
        by_key[key].add(protocol)
    chosen: set[tuple[str, str]] = set()
    for i, key in enumerate(sorted(by_key)):
        present = by_key[key]
        want = PROTOCOLS[i % len(PROTOCOLS)]
        pick = want if want in present else min(present, key=_rank)
        chosen.add((key, pick))
    return chosen


def _rank(protocol: Hashable) -> int:
    return PROTOCOLS.index(protocol) if protocol in PROTOCOLS else len(PROTOCOLS)
