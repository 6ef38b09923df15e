"""``live.fanout.ReadPacer``: how often a project's live feed reads the log under sustained writing.

Pure (the clock is passed in): a burst of reads goes at once, then one read per 1/rate, a quiet
moment restores the burst, and 0 means a read for every wake-up.
"""
from __future__ import annotations

import pytest

from novelforge_sessions.live.fanout import ReadPacer


def test_a_burst_of_reads_goes_at_once_then_one_per_interval():
    pacer = ReadPacer(25.0, burst=4, now=100.0)
    assert [pacer.delay(100.0) for _ in range(4)] == [0.0, 0.0, 0.0, 0.0]
    # The fifth, at the same moment, waits one interval; the sixth two (each read its own turn).
    assert pacer.delay(100.0) == pytest.approx(0.04)
    assert pacer.delay(100.0) == pytest.approx(0.08)


def test_reads_that_keep_pace_are_never_delayed():
    pacer = ReadPacer(25.0, burst=4, now=0.0)
    # One read every 50 ms (a publisher at 20 commits a second) stays under 25 a second.
    assert all(pacer.delay(i * 0.05) == 0.0 for i in range(200))


def test_a_feed_that_waited_its_turn_then_keeps_one_read_per_interval():
    pacer = ReadPacer(10.0, burst=2, now=0.0)
    now, delays = 0.0, []
    for _ in range(12):  # a wake-up always pending: read, then ask again right after
        wait = pacer.delay(now)
        delays.append(wait)
        now += wait
    assert delays[:2] == [0.0, 0.0]
    assert delays[2:] == pytest.approx([0.1] * 10)
    assert now == pytest.approx(1.0)  # 12 reads in 1 s: the burst of 2, then 10 a second


def test_a_quiet_moment_restores_the_burst_and_no_more():
    pacer = ReadPacer(10.0, burst=3, now=0.0)
    for _ in range(3):
        pacer.delay(0.0)
    assert pacer.delay(0.0) > 0  # used up
    # Long quiet: the burst is back, but capped at 3.
    assert [pacer.delay(60.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert pacer.delay(60.0) > 0


def test_zero_reads_per_second_means_every_wake_up_reads_at_once():
    pacer = ReadPacer(0.0, now=0.0)
    assert all(pacer.delay(0.0) == 0.0 for _ in range(1000))

