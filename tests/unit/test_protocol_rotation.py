"""``make test``'s one protocol per protocol-parametrized test (tests.protocol_rotation)."""

from __future__ import annotations

from tests.protocol_rotation import PROTOCOLS, one_protocol_each


def _cases(keys: list[str]) -> list[tuple[str, str]]:
    return [(k, p) for k in keys for p in PROTOCOLS]


def test_each_test_runs_once_and_all_three_protocols_appear() -> None:
    keys = [f"tests/integration/test_x.py::test_{n}[*]" for n in "abcdefg"]
    chosen = one_protocol_each(_cases(keys))
    assert sorted(k for k, _ in chosen) == sorted(keys)
    assert {p for _, p in chosen} == set(PROTOCOLS)


def test_the_choice_follows_the_sorted_keys_not_their_order() -> None:
    keys = ["b[*]", "a[*]", "c[*]"]
    assert one_protocol_each(_cases(keys)) == one_protocol_each(_cases(sorted(keys))) == {
        ("a[*]", "eager-range"), ("b[*]", "cooperative-sticky"), ("c[*]", "kip848-consumer")}


def test_a_test_of_some_protocols_keeps_one_of_them() -> None:
    cases = [("a[*]", "kip848-consumer"), ("b[*-x]", "eager-range"), ("b[*-x]", "kip848-consumer")]
    assert one_protocol_each(cases) == {("a[*]", "kip848-consumer"), ("b[*-x]", "eager-range")}
