"""Topic routing against a brute-force reference matcher, on random bindings and keys."""

from __future__ import annotations

import random

import pytest

from leveret.broker.exchanges.topic import TopicExchange


def reference_match(pattern: str, key: str) -> bool:
    """RabbitMQ's semantics, written the slow obvious way."""
    p = pattern.split(".") if pattern else []  # an empty key is zero words
    k = key.split(".") if key else []

    def go(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(go(i + 1, jj) for jj in range(j, len(k) + 1))
        if j == len(k):
            return False
        return (p[i] == "*" or p[i] == k[j]) and go(i + 1, j + 1)

    return go(0, 0)


@pytest.mark.parametrize(
    "pattern,key,expected",
    [
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("#", "", True),
        ("#", "anything.at.all", True),
        ("*.b", "b", False),
        ("a.*", "a", False),
        ("a.*", "a.b", True),
        ("#.#", "a", True),
        ("a.#", "a", True),
        ("*", "", False),
        ("#.*", "", False),
        ("", "", True),
        ("a..b", "a..b", True),
    ],
)
def test_known_rows(pattern, key, expected):
    ex = TopicExchange()
    ex.bind("q", pattern, {})
    assert ("q" in ex.route(key, None)) is expected
    assert reference_match(pattern, key) is expected


def test_random_bindings_agree_with_reference():
    rng = random.Random(1234)
    words = ["a", "b", "c", "*", "#"]
    ex = TopicExchange()
    patterns = {".".join(rng.choice(words) for _ in range(rng.randint(1, 4))) for _ in range(200)}
    for pattern in patterns:
        ex.bind(pattern, pattern, {})
    for _ in range(500):
        key = ".".join(rng.choice("abc") for _ in range(rng.randint(0, 5)))
        expected = {p for p in patterns if reference_match(p, key)}
        assert set(ex.route(key, None)) == expected, key


def test_unbind_prunes_and_invalidates_cache():
    ex = TopicExchange()
    ex.bind("q1", "a.*", {})
    ex.bind("q2", "a.#", {})
    assert set(ex.route("a.b", None)) == {"q1", "q2"}
    ex.unbind("q1", "a.*", {})
    assert set(ex.route("a.b", None)) == {"q2"}
    ex.unbind("q2", "a.#", {})
    assert ex.route("a.b", None) == ()
    assert ex._root.children == {}
