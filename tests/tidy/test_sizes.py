"""Ratchets on size: functions of at most 60 lines, modules of at most 600 (known offenders may only shrink)."""
from __future__ import annotations

from tests.tidy.known_violations import LONG_FUNCTIONS, LONG_MODULES
from tests.tidy.ratchet import size_ratchet
from tests.tidy.sizes import function_lengths, module_lengths

FUNCTION_LIMIT = 60
MODULE_LIMIT = 600


def test_no_function_is_longer_than_its_limit():
    problems = size_ratchet(LONG_FUNCTIONS, function_lengths(), FUNCTION_LIMIT, "LONG_FUNCTIONS")
    assert not problems, "\n".join(problems)


def test_no_module_is_longer_than_its_limit():
    problems = size_ratchet(LONG_MODULES, module_lengths(), MODULE_LIMIT, "LONG_MODULES")
    assert not problems, "\n".join(problems)


def test_the_size_ratchet_fails_on_growth_and_asks_for_shrinks_to_be_recorded():
    assert size_ratchet({}, {"a.py:f": 60}, 60, "L") == []
    assert "over the limit of 60" in size_ratchet({}, {"a.py:f": 61}, 60, "L")[0]
    assert "grew from 70" in size_ratchet({"a.py:f": 70}, {"a.py:f": 71}, 60, "L")[0]
    assert "lower its size to 65" in size_ratchet({"a.py:f": 70}, {"a.py:f": 65}, 60, "L")[0]
    assert "delete its entry" in size_ratchet({"a.py:f": 70}, {"a.py:f": 50}, 60, "L")[0]
    assert "is gone" in size_ratchet({"a.py:f": 70}, {}, 60, "L")[0]
