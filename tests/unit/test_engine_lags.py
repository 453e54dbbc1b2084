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
    assert 3.0 <= snap.return_ms < 50.0  # 4 and 2 ms ago, plus the time this test took
    assert lags.snapshot() == LagSnapshot(0, 0.0, 0, 0.0)  # a snapshot starts the count again


def test_outputs_without_statistics_or_timestamps_count_nothing():
    lags = EngineLags()
    lags.output(None, time.monotonic(), first=True)  # vLLM's statistics off
    lags.output(SimpleNamespace(queued_ts=0.0, last_token_ts=0.0), time.monotonic(), first=True)
    assert lags.snapshot() == LagSnapshot(0, 0.0, 0, 0.0)


def test_the_log_line_reads_back_and_intervals_combine_weighted_by_their_counts():
    first, second = LagSnapshot(3, 2.0, 30, 1.0), LagSnapshot(1, 6.0, 10, 5.0)
    line = f"I1124 model.py:1] vllm_core {second.describe()}"
    assert parse_line(line) == second
    assert parse_line("vllm_core engine steps: 3 in 0.50 s") is None
    both = combine([first, second])
    assert (both.requests, both.outputs) == (4, 40)
    assert both.intake_ms == pytest.approx(3.0) and both.return_ms == pytest.approx(2.0)
    assert combine([LagSnapshot(0, 0.0, 0, 0.0)]) is None
