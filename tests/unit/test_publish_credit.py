"""PublishCredit: a channel's socket pauses past the soft limit plus the reader's
credit, and reads again once `more_credit_after` of those enqueues are done."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warren.broker.amqp.publish_credit import PublishCredit


def take(credit: PublishCredit, count: int) -> list[int]:
    """Enqueue `count` more; the in-flight counts at which the socket paused."""
    return [credit.in_flight for _ in range(count) if credit.took()]


def finish(credit: PublishCredit, count: int) -> list[int]:
    return [credit.in_flight for _ in range(count) if credit.done()]


def test_a_window_past_the_soft_limit_but_within_the_credit_is_read_on():
    # a client's 256 publishes in flight, read in two socket reads: neither read pauses
    credit = PublishCredit(soft_limit=32, initial_credit=400, more_credit_after=200)
    assert take(credit, 235) == []
    assert take(credit, 21) == []
    assert not credit.paused


def test_pauses_once_past_soft_limit_plus_credit_and_resumes_after_more_credit_after():
    credit = PublishCredit(soft_limit=32, initial_credit=400, more_credit_after=200)
    assert take(credit, 432) == []
    assert take(credit, 100) == [433], "the socket pauses at the first enqueue past 432"
    assert credit.paused
    # 532 in flight: reading comes back once 232 or fewer are
    assert finish(credit, 299) == []
    assert finish(credit, 1) == [232]
    assert not credit.paused
    assert take(credit, 200) == []
    assert take(credit, 1) == [433]


def test_release_reports_whether_the_channel_held_its_socket():
    credit = PublishCredit(soft_limit=1, initial_credit=0, more_credit_after=0)
    assert not credit.release()
    take(credit, 2)
    assert credit.release()
    assert not credit.paused


@given(st.lists(st.booleans(), max_size=400), st.integers(1, 40), st.integers(0, 60), st.integers(0, 80))
def test_paused_exactly_while_over_the_limit_since_the_last_resume(steps, soft_limit, initial, more_after):
    """Pause/resume signals alternate, and reading is held only with more than
    soft_limit + initial_credit - more_credit_after enqueues in flight."""
    credit = PublishCredit(soft_limit, initial, more_after)
    paused = False
    for take_one in steps:
        if take_one:
            if credit.took():
                assert not paused, "paused twice without a resume"
                paused = True
                assert credit.in_flight == soft_limit + initial + 1
        elif credit.in_flight:
            if credit.done():
                assert paused, "resumed without a pause"
                paused = False
                assert credit.in_flight == max(0, soft_limit + initial - more_after)
        assert credit.paused == paused
        if paused:
            assert credit.in_flight > max(0, soft_limit + initial - more_after)
        assert credit.in_flight <= soft_limit + initial or paused
