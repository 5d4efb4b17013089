"""Exchanges: the routing tables of AMQP 0-9-1 §3.1.3 and RabbitMQ's extensions.

An exchange maps a routing key (and, for headers exchanges, the message's
headers) to a set of destinations. A destination is ``("queue", name)`` or
``("exchange", name)`` (exchange-to-exchange bindings). Pure data structures;
the vhost follows exchange destinations and alternate exchanges.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Destination = tuple[str, str]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
# every vhost's built-in exchanges (besides the default exchange ""), all durable
DEFAULT_EXCHANGES = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


@dataclass(frozen=True, slots=True)
class Binding:
    source: str
    destination: Destination
    routing_key: str
    arguments: tuple  # sorted items of the arguments table, hashable: the binding's identity
    table: dict = field(default_factory=dict, compare=False, hash=False)  # the arguments as given

    @staticmethod
    def make(source: str, destination: Destination, routing_key: str, arguments: dict | None) -> "Binding":
        return Binding(source, destination, routing_key, _freeze(arguments or {}), dict(arguments or {}))


def _freeze(table: dict) -> tuple:
    return tuple(sorted((k, _freeze(v) if isinstance(v, dict) else repr(v) if isinstance(v, list) else v)
                        for k, v in table.items()))


@dataclass(slots=True)
class Exchange:
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)
    bindings: set[Binding] = field(default_factory=set)
    # destination -> its bindings here: a queue's deletion unbinds it without a scan
    # (thousands of exclusive queues bound to one fanout exchange is a common shape)
    by_destination: dict[Destination, set[Binding]] = field(default_factory=dict)

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None

    def bind(self, binding: Binding) -> None:
        self.bindings.add(binding)
        self.by_destination.setdefault(binding.destination, set()).add(binding)

    def unbind(self, binding: Binding) -> bool:
        if binding in self.bindings:
            self.bindings.discard(binding)
            to_destination = self.by_destination[binding.destination]
            to_destination.discard(binding)
            if not to_destination:
                del self.by_destination[binding.destination]
            return True
        return False

    def unbind_destination(self, destination: Destination) -> int:
        gone = list(self.by_destination.get(destination, ()))
        for binding in gone:
            self.unbind(binding)
        return len(gone)

    def route(self, routing_key: str, headers: dict | None) -> set[Destination]:
        raise NotImplementedError


class DirectExchange(Exchange):
    __slots__ = ("_by_key",)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._by_key: dict[str, set[Destination]] = {}

    def bind(self, binding: Binding) -> None:
        if binding in self.bindings:
            return
        super().bind(binding)
        self._by_key.setdefault(binding.routing_key, set()).add(binding.destination)

    def unbind(self, binding: Binding) -> bool:
        if not super().unbind(binding):
            return False
        if not any(b.routing_key == binding.routing_key for b in self.by_destination.get(binding.destination, ())):
            targets = self._by_key[binding.routing_key]
            targets.discard(binding.destination)
            if not targets:
                del self._by_key[binding.routing_key]
        return True

    def route(self, routing_key: str, headers: dict | None) -> set[Destination]:
        return self._by_key.get(routing_key, _EMPTY)


class FanoutExchange(Exchange):
    __slots__ = ()

    def route(self, routing_key: str, headers: dict | None) -> set[Destination]:
        return set(self.by_destination)


class TopicExchange(Exchange):
    """Topic matching with a trie of words; '*' is one word, '#' zero or more."""

    __slots__ = ("_trie", "_cache")
    _CACHE_MAX = 4096

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._trie = _TrieNode()
        self._cache: dict[str, set[Destination]] = {}

    def bind(self, binding: Binding) -> None:
        if binding in self.bindings:
            return  # re-binding is a no-op; the trie counts distinct bindings
        super().bind(binding)
        node = self._trie
        for word in _words(binding.routing_key):
            node = node.children.setdefault(word, _TrieNode())
        node.destinations[binding.destination] = node.destinations.get(binding.destination, 0) + 1
        self._cache.clear()

    def unbind(self, binding: Binding) -> bool:
        if not super().unbind(binding):
            return False
        path = [self._trie]
        words = _words(binding.routing_key)
        for word in words:
            path.append(path[-1].children[word])
        leaf = path[-1]
        leaf.destinations[binding.destination] -= 1
        if not leaf.destinations[binding.destination]:
            del leaf.destinations[binding.destination]
        for depth in range(len(words), 0, -1):  # prune empty branches
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]
        self._cache.clear()
        return True

    def route(self, routing_key: str, headers: dict | None) -> set[Destination]:
        cached = self._cache.get(routing_key)
        if cached is not None:
            return cached
        found: set[Destination] = set()
        _match(self._trie, _words(routing_key), 0, found)
        if len(self._cache) >= self._CACHE_MAX:
            self._cache.clear()
        self._cache[routing_key] = found
        return found


def _words(key: str) -> list[str]:
    # As RabbitMQ: the empty key has no words (so '*' does not match it).
    return key.split(".") if key else []


class _TrieNode:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.destinations: dict[Destination, int] = {}


def _match(node: _TrieNode, words: list[str], at: int, found: set) -> None:
    if at == len(words):
        found.update(node.destinations)
        hash_node = node.children.get("#")
        if hash_node is not None:
            _match(hash_node, words, at, found)
        return
    child = node.children.get(words[at])
    if child is not None:
        _match(child, words, at + 1, found)
    star = node.children.get("*")
    if star is not None:
        _match(star, words, at + 1, found)
    hash_node = node.children.get("#")
    if hash_node is not None:
        for skip in range(at, len(words) + 1):  # '#' eats zero or more words
            _match(hash_node, words, skip, found)


class HeadersExchange(Exchange):
    __slots__ = ()

    def route(self, routing_key: str, headers: dict | None) -> set[Destination]:
        headers = headers or {}
        return {b.destination for b in self.bindings if headers_match(b.table, headers)}


def headers_match(arguments: dict, headers: dict) -> bool:
    """RabbitMQ's rule: x-match all (default) or any; other 'x-' arguments are
    compared only in the all-with-x / any-with-x modes."""
    mode = arguments.get("x-match", "all")
    with_x = mode in ("any-with-x", "all-with-x")
    wanted = [(k, v) for k, v in arguments.items() if k != "x-match" and (with_x or not k.startswith("x-"))]
    if mode in ("any", "any-with-x"):
        return any(k in headers and (v is None or _header_equal(v, headers[k])) for k, v in wanted)
    return all(k in headers and (v is None or _header_equal(v, headers[k])) for k, v in wanted)


def _header_equal(wanted: object, given: object) -> bool:
    """As rabbit_exchange_type_headers: a string matches a byte array of the same bytes
    (pika sends `bytes` as one); a boolean matches only a boolean and an integer only an
    integer (RabbitMQ's type classes; Python's True == 1 and 1 == 1.0 do not hold there)."""
    if isinstance(wanted, (str, bytes)) and isinstance(given, (str, bytes)):
        return _as_bytes(wanted) == _as_bytes(given)
    if isinstance(wanted, bool) or isinstance(given, bool) or isinstance(wanted, float) != isinstance(given, float):
        return type(wanted) is type(given) and wanted == given
    return wanted == given


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


_EMPTY: set[Destination] = frozenset()  # type: ignore[assignment]

_TYPES = {
    "direct": DirectExchange,
    "fanout": FanoutExchange,
    "topic": TopicExchange,
    "headers": HeadersExchange,
}


def make_exchange(name: str, type_: str, durable: bool = True, auto_delete: bool = False,
                  internal: bool = False, arguments: dict | None = None) -> Exchange:
    return _TYPES[type_](name, type_, durable, auto_delete, internal, dict(arguments or {}))
