"""tools/bench_tokenizer_gil.py: the busy thread is counted, and the tokenizing calls come at the asked rate."""

from __future__ import annotations

from tools.bench_tokenizer_gil import run


def test_alone_the_busy_thread_is_counted_and_nothing_is_tokenized():
    items, latencies = run(None, rate=100, seconds=0.2)
    assert items > 1000 and latencies == []


def test_the_tokenizing_calls_come_at_the_rate_and_each_latency_is_recorded():
    calls: list[int] = []
    items, latencies = run(lambda: calls.append(1), rate=50, seconds=0.4)
    assert items > 1000
    assert 12 <= len(calls) <= 25 and len(latencies) == len(calls)  # ~20 calls in 0.4 s at 50/s
    assert all(0 <= seconds < 0.4 for seconds in latencies)
