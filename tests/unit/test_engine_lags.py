"""core/engine_lags.py: the trips to and from the EngineCore, from vLLM's per-request timestamps (fakes here)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from core.engine_lags import EngineLags, LagSnapshot, combine, parse_line


def test_intake_counts_each_requests_first_output_and_return_every_output():
    lags = EngineLags()
    now = time.monotonic()
    submitted = now - 0.050
    queued = now - 0.040  # the EngineCore queued it 10 ms after it was handed over
    lags.output(SimpleNamespace(queued_ts=queued, last_token_ts=now - 0.004), submitted, first=True)
    lags.output(SimpleNamespace(queued_ts=queued, last_token_ts=now - 0.002), submitted, first=False)
    snap = lags.snapshot()
    assert (snap.requests, snap.outputs) == (1, 2)
    assert snap.intake_ms == pytest.approx(10.0, abs=0.01)
    assert 3.0 <= snap.return_ms < 1000.0  # 4 and 2 ms ago, plus the time this test took (a loaded machine stalls)
    assert lags.snapshot() == LagSnapshot(0, 0.0, 0, 0.0)  # a snapshot starts the count again


def test_a_finished_requests_time_inside_the_engine_splits_into_queue_first_token_and_per_token():
    lags = EngineLags()
    queued = time.monotonic() - 1.0
    stats = SimpleNamespace(
        queued_ts=queued,
        scheduled_ts=queued + 0.004,  # 4 ms in the scheduler's queue
        first_token_ts=queued + 0.030,  # its prompt's steps: 26 ms
        last_token_ts=queued + 0.030 + 63 * 0.007,  # 63 more tokens, 7 ms each
        num_generation_tokens=64,
    )
    lags.output(stats, queued - 0.010, first=True)  # not finished: counts for intake and return only
    lags.output(stats, queued - 0.010, first=False, finished=True)
    snap = lags.snapshot()
    assert (snap.requests, snap.outputs, snap.finished) == (1, 2, 1)
    assert snap.queue_ms == pytest.approx(4.0) and snap.prefill_ms == pytest.approx(26.0)
    assert snap.token_ms == pytest.approx(7.0)
    # a request of one token has no time per token, one without a scheduled timestamp no split: neither counts
    lags.output(SimpleNamespace(**{**vars(stats), "num_generation_tokens": 1}), queued, first=True, finished=True)
    lags.output(SimpleNamespace(**{**vars(stats), "scheduled_ts": 0.0}), queued, first=True, finished=True)
    assert lags.snapshot().finished == 0


def test_outputs_without_statistics_or_timestamps_count_nothing():
    lags = EngineLags()
    lags.output(None, time.monotonic(), first=True)  # vLLM's statistics off
    lags.output(SimpleNamespace(queued_ts=0.0, last_token_ts=0.0), time.monotonic(), first=True)
    assert lags.snapshot() == LagSnapshot(0, 0.0, 0, 0.0)


def test_the_log_line_reads_back_and_intervals_combine_weighted_by_their_counts():
    first = LagSnapshot(3, 2.0, 30, 1.0, finished=3, queue_ms=1.0, prefill_ms=20.0, token_ms=6.0)
    second = LagSnapshot(1, 6.0, 10, 5.0, finished=1, queue_ms=5.0, prefill_ms=40.0, token_ms=10.0)
    line = f"I1124 model.py:1] vllm_core {second.describe()}"
    assert parse_line(line) == second
    assert parse_line("vllm_core engine steps: 3 in 0.50 s") is None
    both = combine([first, second])
    assert (both.requests, both.outputs, both.finished) == (4, 40, 4)
    assert both.intake_ms == pytest.approx(3.0) and both.return_ms == pytest.approx(2.0)
    assert (both.queue_ms, both.prefill_ms, both.token_ms) == pytest.approx((2.0, 25.0, 7.0))
    assert combine([LagSnapshot(0, 0.0, 0, 0.0)]) is None


def test_the_hand_over_is_the_wait_until_vllms_front_end_stamped_arrival_by_the_wall_clock():
    lags = EngineLags()
    now = time.monotonic()
    submitted = now - 0.050
    # vLLM's front end took the inputs in 30 ms after the hand-over (wall clock), the EngineCore queued it 5 ms later
    arrival = time.time() - 0.020
    stats = SimpleNamespace(arrival_time=arrival, queued_ts=now - 0.015, last_token_ts=now - 0.001)
    lags.output(stats, submitted, first=True)
    lags.output(stats, submitted, first=False)  # only a request's first output counts
    lags.output(SimpleNamespace(queued_ts=now - 0.015, last_token_ts=now), submitted, first=True)  # no arrival_time
    snap = lags.snapshot()
    assert (snap.requests, snap.handed) == (2, 1)
    assert snap.handover_ms == pytest.approx(30.0, abs=2.0)  # the two clocks read a moment apart
    assert snap.intake_ms == pytest.approx(35.0, abs=0.01)


def test_lines_without_the_hand_over_still_read_and_combine_weights_it_by_its_own_count():
    with_it = LagSnapshot(
        2, 30.0, 4, 10.0, finished=2, queue_ms=1.0, prefill_ms=20.0, token_ms=6.0, handed=2, handover_ms=12.0
    )
    assert parse_line(with_it.describe()) == with_it
    older = with_it.describe().split("; hand-over")[0]
    assert parse_line(older) == LagSnapshot(2, 30.0, 4, 10.0, finished=2, queue_ms=1.0, prefill_ms=20.0, token_ms=6.0)
    both = combine([with_it, parse_line(older), LagSnapshot(1, 10.0, 0, 0.0, handed=1, handover_ms=3.0)])
    assert both.handed == 3 and both.handover_ms == pytest.approx(9.0)
