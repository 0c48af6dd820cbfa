"""topic: dot-separated words; `*` matches one word, `#` zero or more.

Bindings live in a trie keyed by word, so a message walks only the branches its
words can match instead of testing every binding. Results are cached per
routing key (most applications use a handful of keys) and the cache is
dropped whenever the bindings change.
"""

from __future__ import annotations

from typing import Any

from leveret.broker.exchanges.base import ExchangeType, RefCounts

_CACHE_LIMIT = 4096


def _words(key: str) -> list[str]:
    """An empty key is zero words (so `*` does not match it), as in RabbitMQ."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.dests = RefCounts()


class TopicExchange(ExchangeType):
    name = "topic"

    def __init__(self) -> None:
        self._root = _Node()
        self._cache: dict[str, tuple[Any, ...]] = {}

    def bind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        node = self._root
        for word in _words(routing_key):
            node = node.children.setdefault(word, _Node())
        node.dests.add(destination)
        self._cache.clear()

    def unbind(self, destination: Any, routing_key: str, arguments: dict[str, Any]) -> None:
        path = [self._root]
        words = _words(routing_key)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        path[-1].dests.remove(destination)
        # Prune empty branches so the trie does not grow with churn.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()

    def route(self, routing_key: str, message: Any):
        cached = self._cache.get(routing_key)
        if cached is None:
            found: set[Any] = set()
            self._match(self._root, _words(routing_key), 0, found)
            cached = tuple(found)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[routing_key] = cached
        return cached

    def _match(self, node: _Node, words: list[str], i: int, found: set[Any]) -> None:
        children = node.children
        hash_node = children.get("#")
        if i == len(words):
            found.update(node.dests)
            if hash_node is not None:
                self._match(hash_node, words, i, found)
            return
        child = children.get(words[i])
        if child is not None:
            self._match(child, words, i + 1, found)
        star = children.get("*")
        if star is not None:
            self._match(star, words, i + 1, found)
        if hash_node is not None:
            # `#` swallows zero or more words: try every split point.
            for j in range(i, len(words) + 1):
                self._match(hash_node, words, j, found)
