"""broker/routing/exchanges.py: routing by direct, fanout, topic (trie) and headers exchanges.

Topic matching is checked against a naive recursive matcher written from the
rule itself (RabbitMQ's: words split on '.', '*' is exactly one word, '#' zero
or more, the empty routing key has zero words).
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.routing.exchanges import Binding, TopicExchange, headers_match, make_exchange


def q(name: str) -> tuple[str, str]:
    return ("queue", name)


def bind(exchange, routing_key: str, queue: str, arguments: dict | None = None) -> Binding:
    binding = Binding.make(exchange.name, q(queue), routing_key, arguments)
    exchange.bind(binding)
    return binding


# -- the reference matcher --------------------------------------------------------

def words_of(key: str) -> list[str]:
    return [] if key == "" else key.split(".")


def reference_match(pattern: list[str], key: list[str]) -> bool:
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return reference_match(rest, key) or (bool(key) and reference_match(pattern, key[1:]))
    if not key:
        return False
    return (head == "*" or head == key[0]) and reference_match(rest, key[1:])


@pytest.mark.parametrize("pattern, key, expected", [
    ("a.b", "a.b", True), ("a.*", "a.b", True), ("a.*", "a", False), ("a.*", "a.b.c", False),
    ("a.#", "a", True), ("a.#", "a.b.c", True), ("#", "", True), ("#", "x.y", True), ("#.b", "b", True),
    ("*.#.b", "a.b", True), ("*.#.b", "b", False), ("a.#.#.c", "a.c", True), ("*", "", False), ("", "", True),
])
def test_reference_matcher_itself(pattern, key, expected):
    assert reference_match(words_of(pattern), words_of(key)) is expected, f"reference: {pattern!r} vs {key!r}"


# -- topic --------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, key, expected", [
    ("stock.usd.nyse", "stock.usd.nyse", True),
    ("stock.*.nyse", "stock.eur.nyse", True),
    ("stock.*.nyse", "stock.nyse", False),
    ("stock.#", "stock", True),
    ("stock.#", "stock.usd.nyse", True),
    ("#.nyse", "stock.usd.nyse", True),
    ("#", "anything.at.all", True),
    ("*.*", "a.b", True),
    ("*.*", "a.b.c", False),
    ("a.#.z", "a.z", True),
    ("a.#.z", "a.b.c.z", True),
    ("a.#.z", "a.b.c", False),
    ("#.#", "a", True),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
])
def test_topic_examples(pattern, key, expected):
    exchange = make_exchange("t", "topic")
    bind(exchange, pattern, "q")
    got = q("q") in exchange.route(key, None)
    assert got is expected, f"topic binding {pattern!r}, routing key {key!r}: matched={got}, expected {expected}"


@pytest.mark.parametrize("pattern", ["*", "*.#", "#.*"])
def test_empty_routing_key_has_no_words(pattern):
    """RabbitMQ splits '' into zero words, so '*' (exactly one word) must not match it."""
    exchange = make_exchange("t", "topic")
    bind(exchange, pattern, "q")
    assert exchange.route("", None) == set(), (
        f"binding {pattern!r} matched the empty routing key, which has zero words (RabbitMQ: no match)")


def test_topic_same_queue_bound_twice_survives_one_unbind():
    exchange = make_exchange("t", "topic")
    first = bind(exchange, "a.*", "q", {"k": 1})
    bind(exchange, "a.*", "q", {"k": 2})
    assert exchange.unbind(first), "unbind of an existing binding returned False"
    assert exchange.route("a.b", None) == {q("q")}, "the second binding with other arguments was lost"


def test_topic_rebinding_the_same_binding_then_unbinding_stops_routing():
    """queue.bind is idempotent (clients re-declare their bindings at every start);
    one queue.unbind must then remove the route."""
    exchange = make_exchange("t", "topic")
    binding = bind(exchange, "a.*", "q")
    exchange.bind(binding)  # the same binding again
    assert len(exchange.bindings) == 1, f"a repeated bind made {len(exchange.bindings)} bindings"
    assert exchange.unbind(binding), "unbind returned False"
    got = exchange.route("a.b", None)
    assert got == set(), (
        f"after bind, bind again, unbind: routing key 'a.b' still reaches {got} "
        "(the trie counted the repeated bind twice; unbind removed only one count)")


def test_direct_rebinding_the_same_binding_then_unbinding_stops_routing():
    exchange = make_exchange("d", "direct")
    binding = bind(exchange, "k", "q")
    exchange.bind(binding)
    exchange.unbind(binding)
    assert exchange.route("k", None) == set(), "direct: a repeated bind survived one unbind"


def test_topic_unbind_of_unknown_binding_is_false():
    exchange = make_exchange("t", "topic")
    bind(exchange, "a.b", "q")
    assert not exchange.unbind(Binding.make("t", q("q"), "a.c", None)), "unbinding a binding never made"
    assert exchange.route("a.b", None) == {q("q")}, "a failed unbind removed a route"


def test_topic_trie_is_pruned_after_unbinding_everything():
    exchange = make_exchange("t", "topic")
    made = [bind(exchange, p, f"q{i}") for i, p in enumerate(["a.b.c", "a.#", "a.*.c", "#", "x"])]
    for binding in made:
        exchange.unbind(binding)
    assert not exchange._trie.children and not exchange._trie.destinations, (
        f"trie not pruned: {list(exchange._trie.children)}")


def test_topic_route_cache_is_invalidated_by_bind_and_unbind():
    exchange = make_exchange("t", "topic")
    assert exchange.route("a.b", None) == set(), "empty exchange routed somewhere"
    binding = bind(exchange, "a.*", "q")
    assert exchange.route("a.b", None) == {q("q")}, "a cached empty result survived bind"
    exchange.unbind(binding)
    assert exchange.route("a.b", None) == set(), "a cached result survived unbind"


# hypothesis: small alphabets make collisions (and so matches) likely.
key_words = st.sampled_from(["a", "b", "c", "", "*", "#"])
pattern_words = st.sampled_from(["a", "b", "c", "", "*", "#", "#", "*"])


def dotted(words: st.SearchStrategy) -> st.SearchStrategy:
    # [""] would be the empty key, which RabbitMQ reads as zero words: tested on its own above.
    return st.lists(words, min_size=1, max_size=5).filter(lambda w: w != [""]).map(".".join)


operations = st.lists(st.one_of(
    st.tuples(st.just("bind"), dotted(pattern_words), st.sampled_from(["q1", "q2", "q3"]), st.integers(0, 1)),
    st.tuples(st.just("unbind"), st.integers(0, 50)),
    st.tuples(st.just("route"), dotted(key_words)),
), max_size=40)


@settings(max_examples=500, deadline=None)
@given(ops=operations, final_keys=st.lists(dotted(key_words), max_size=10))
def test_topic_routing_agrees_with_the_reference_matcher(ops, final_keys):
    exchange = make_exchange("t", "topic")
    bound: list[Binding] = []

    def expected(key: str) -> set:
        return {b.destination for b in bound if reference_match(words_of(b.routing_key), words_of(key))}

    def check(key: str, when: str) -> None:
        got = exchange.route(key, None)
        want = expected(key)
        assert got == want, (
            f"{when}: routing key {key!r} reached {sorted(got)}, reference says {sorted(want)}; "
            f"bindings {[(b.routing_key, b.destination[1]) for b in bound]}")

    for n, op in enumerate(ops):
        if op[0] == "bind":
            _, pattern, queue, variant = op
            binding = Binding.make("t", q(queue), pattern, {"v": variant})
            if binding not in bound:  # repeated binds: test_topic_rebinding_the_same_binding_...
                exchange.bind(binding)
                bound.append(binding)
        elif op[0] == "unbind":
            if bound:
                binding = bound.pop(op[1] % len(bound))
                assert exchange.unbind(binding), f"unbind of bound {binding} returned False"
        else:
            check(op[1], f"after {n} operations")
    for key in final_keys:
        check(key, "at the end")
        check(key, "at the end, routed again (cached)")
    for binding in list(bound):
        exchange.unbind(binding)
    assert not exchange._trie.children, f"trie not empty after unbinding everything: {list(exchange._trie.children)}"


# -- direct -------------------------------------------------------------------------

def test_direct_routes_on_exact_key_only():
    exchange = make_exchange("d", "direct")
    bind(exchange, "k1", "q1")
    bind(exchange, "k1", "q2")
    bind(exchange, "k2", "q2")
    assert exchange.route("k1", None) == {q("q1"), q("q2")}, f"k1 -> {exchange.route('k1', None)}"
    assert exchange.route("k2", None) == {q("q2")}, f"k2 -> {exchange.route('k2', None)}"
    assert exchange.route("k", None) == set(), "a prefix of a key routed"
    assert exchange.route("*", None) == set(), "direct exchanges have no wildcards"


def test_direct_unbind_keeps_other_bindings_of_the_same_key_and_queue():
    exchange = make_exchange("d", "direct")
    one = bind(exchange, "k", "q", {"a": 1})
    two = bind(exchange, "k", "q", {"a": 2})
    exchange.unbind(one)
    assert exchange.route("k", None) == {q("q")}, "unbinding one of two bindings removed the route"
    exchange.unbind(two)
    assert exchange.route("k", None) == set(), "route survived unbinding both"
    assert not exchange.unbind(two), "second unbind of the same binding returned True"


def test_unbind_destination_removes_all_its_bindings():
    exchange = make_exchange("d", "direct")
    bind(exchange, "k1", "q")
    bind(exchange, "k2", "q")
    bind(exchange, "k1", "other")
    assert exchange.unbind_destination(q("q")) == 2, "unbind_destination count"
    assert exchange.route("k1", None) == {q("other")} and exchange.route("k2", None) == set(), "leftover routes"


# -- fanout -------------------------------------------------------------------------

def test_fanout_ignores_the_routing_key():
    exchange = make_exchange("f", "fanout")
    bind(exchange, "", "q1")
    bind(exchange, "whatever", "q2")
    for key in ("", "x", "a.b.c"):
        assert exchange.route(key, None) == {q("q1"), q("q2")}, f"fanout with key {key!r}"


# -- headers ------------------------------------------------------------------------

@pytest.mark.parametrize("arguments, headers, expected", [
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1}, {"a": 2}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "all"}, {}, True),  # no keys to compare: all of nothing holds
    ({"x-match": "any"}, {"a": 1}, False),  # nothing to match any of
    ({"x-match": "all", "x-other": "ignored", "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "a": None}, {"a": "anything"}, True),  # void value: presence only
    ({"x-match": "all", "a": None}, {}, False),
    ({"a": 1}, None, False),
    # RabbitMQ's type classes: a byte array matches a string of its bytes (pika sends
    # `bytes` as one), a boolean or a float is not an integer (Python's == says otherwise)
    ({"b": "two"}, {"b": b"two"}, True),
    ({"b": b"two"}, {"b": "two"}, True),
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": 1}, {"a": 1.0}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": 1.5}, {"a": 1.5}, True),
])
def test_headers_match_rules(arguments, headers, expected):
    got = headers_match(arguments, headers or {})
    assert got is expected, f"binding {arguments} vs headers {headers}: {got}, expected {expected}"


def test_headers_exchange_routes_with_x_match_all_and_any():
    exchange = make_exchange("h", "headers")
    bind(exchange, "", "all", {"x-match": "all", "format": "pdf", "type": "report"})
    bind(exchange, "", "any", {"x-match": "any", "format": "pdf", "type": "report"})
    assert exchange.route("", {"format": "pdf", "type": "report"}) == {q("all"), q("any")}, "both should match"
    assert exchange.route("", {"format": "pdf", "type": "log"}) == {q("any")}, "only any should match"
    assert exchange.route("", {"format": "zip"}) == set(), "neither should match"
    assert exchange.route("ignored.key", None) == set(), "no headers: nothing to match"


def test_headers_exchange_matches_array_values():
    exchange = make_exchange("h", "headers")
    bind(exchange, "", "q", {"x-match": "all", "tags": ["a", "b"]})
    got = exchange.route("", {"tags": ["a", "b"]})
    assert got == {q("q")}, (
        f"binding argument tags=['a', 'b'] did not match the equal header (routed to {got}); "
        "Binding freezes list arguments to their repr string, so they never equal a header list")


def test_headers_exchange_matches_table_values():
    exchange = make_exchange("h", "headers")
    bind(exchange, "", "q", {"x-match": "all", "meta": {"v": 1}})
    got = exchange.route("", {"meta": {"v": 1}})
    assert got == {q("q")}, (
        f"binding argument meta={{'v': 1}} did not match the equal header (routed to {got}); "
        "Binding freezes table arguments to tuples, so they never equal a header table")


@pytest.mark.parametrize("mode, headers, expected", [
    ("any-with-x", {"x-tenant": "t1"}, True),
    ("all-with-x", {"x-tenant": "t1"}, True),
    ("all-with-x", {"x-tenant": "t2"}, False),
])
def test_with_x_modes_also_compare_x_headers(mode, headers, expected):
    """RabbitMQ 3.10+: any-with-x / all-with-x match on x- arguments too."""
    got = headers_match({"x-match": mode, "x-tenant": "t1"}, headers)
    assert got is expected, f"x-match={mode}, binding x-tenant=t1, headers {headers}: {got}, expected {expected}"


def test_exchange_types_are_built_by_name():
    for type_ in ("direct", "fanout", "topic", "headers"):
        exchange = make_exchange("e", type_, arguments={"alternate-exchange": "ae"})
        assert exchange.type == type_, f"make_exchange({type_!r}) built a {exchange.type}"
        assert exchange.alternate_exchange == "ae", "alternate-exchange argument not read"
    assert isinstance(make_exchange("t", "topic"), TopicExchange)


binding_ops = st.lists(st.tuples(st.sampled_from(["bind", "unbind", "unbind_destination"]),
                                 st.sampled_from(["q1", "q2", "q3"]), st.sampled_from(["a", "b", "a.b"])),
                       max_size=40)


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic"])
@given(ops=binding_ops)
@settings(max_examples=150, deadline=None)
def test_the_destination_index_always_agrees_with_the_bindings(exchange_type, ops):
    """`by_destination` lets a queue's deletion unbind it without a scan; it must name
    exactly the bindings there are, and routing must follow them."""
    exchange = make_exchange("x", exchange_type)
    for op, queue, key in ops:
        binding = Binding.make("x", ("queue", queue), key, None)
        if op == "bind":
            exchange.bind(binding)
        elif op == "unbind":
            exchange.unbind(binding)
        else:
            exchange.unbind_destination(("queue", queue))
        expected: dict = {}
        for b in exchange.bindings:
            expected.setdefault(b.destination, set()).add(b)
        assert exchange.by_destination == expected, f"after {op} {queue} {key}"
        for key_routed in ("a", "b", "a.b"):
            routed = exchange.route(key_routed, None)
            wanted = {b.destination for b in exchange.bindings
                      if exchange_type == "fanout" or b.routing_key == key_routed}
            assert set(routed) == wanted, f"{exchange_type} routed {key_routed} to {routed}: {exchange.bindings}"
