"""When warren-server executes itself again for huge pages (broker/node/malloc_tuning.py)."""
from __future__ import annotations

import pytest

from warren.broker.node.malloc_tuning import environment_with_huge_pages


def test_linux_without_the_tunable_gets_it_and_keeps_the_rest_of_the_environment():
    env = environment_with_huge_pages({"PATH": "/bin", "WARREN_AMQP_PORT": "5672"}, "linux")
    assert env == {"PATH": "/bin", "WARREN_AMQP_PORT": "5672", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def test_other_tunables_are_kept_beside_it():
    env = environment_with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux")
    assert env is not None and env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize("tunables", ["glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=0",
                                      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0"])
def test_a_tunable_already_set_is_left_alone_so_the_server_executes_itself_once(tunables):
    assert environment_with_huge_pages({"GLIBC_TUNABLES": tunables}, "linux") is None, (
        f"with GLIBC_TUNABLES={tunables} the server must not execute itself again (a loop, or the user's choice)")


def test_not_on_linux_nothing_is_done():
    assert environment_with_huge_pages({}, "darwin") is None
