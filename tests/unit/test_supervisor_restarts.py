"""A shard that could not start for want of disk space is started again, sooner first, for as
long as the disk stays full (broker/node/supervisor.py `no_space_restart_delay`)."""
from __future__ import annotations

from warren.broker.node.supervisor import NO_SPACE_RESTART_MAX_SECONDS, no_space_restart_delay


def test_the_delay_doubles_from_a_quarter_second_and_stays_at_its_cap():
    delays = [no_space_restart_delay(in_a_row) for in_a_row in range(1, 10)]
    assert delays[:5] == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert delays[5:] == [NO_SPACE_RESTART_MAX_SECONDS] * 4
    assert no_space_restart_delay(10_000) == NO_SPACE_RESTART_MAX_SECONDS
