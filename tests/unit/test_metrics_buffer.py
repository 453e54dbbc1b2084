"""core.metrics.StatsBuffer: vLLM's stat-logger records become one drainable delta; GaugeClock: gauges shared by
several processes are set newest-first (no Triton needed)."""

from __future__ import annotations

import multiprocessing
import threading
import time

from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from core.metrics import COUNTERS, HISTOGRAMS, GaugeClock, StatsBuffer


def _iteration(prompt: int, generated: int, finished: list[FinishedRequestStats]) -> IterationStats:
    stats = IterationStats()
    stats.prompt_token_stats.total = prompt
    stats.num_generation_tokens = generated
    stats.time_to_first_tokens_iter = [0.01] if prompt else []
    stats.finished_requests = finished
    return stats


def test_drain_sums_counters_keeps_latest_gauges_and_every_sample():
    buffer = StatsBuffer()
    assert buffer.drain().empty()
    buffer.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.5), _iteration(7, 1, []))
    done = FinishedRequestStats("length", e2e_latency=0.3, num_prompt_tokens=7, num_generation_tokens=4)
    buffer.record(SchedulerStats(num_running_reqs=0, kv_cache_usage=0.0), _iteration(0, 3, [done]))
    assert buffer.changed.is_set()
    delta = buffer.drain()
    assert not buffer.changed.is_set()
    assert delta.counters["generation_tokens"] == 4
    assert delta.counters["request_success"] == 1
    assert delta.gauges == {"running": 0.0, "waiting": 0.0, "kv_cache_usage": 0.0}
    assert 0 < delta.gauges_at <= time.monotonic()
    assert delta.samples["e2e_request_latency"] == [0.3]
    assert delta.samples["request_generation_tokens"] == [4]
    assert delta.samples["request_prompt_tokens"] == [7]
    assert delta.samples["time_to_first_token"] == [0.01]
    assert buffer.drain().empty()


def test_records_from_many_threads_lose_nothing():
    buffer = StatsBuffer()

    def work() -> None:
        for _ in range(1000):
            buffer.record(None, _iteration(0, 1, []))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert buffer.drain().counters["generation_tokens"] == 8000
    assert set(COUNTERS) >= {"prompt_tokens", "generation_tokens"}
    assert {"time_to_first_token", "time_per_output_token", "e2e_request_latency"} <= set(HISTOGRAMS)


def test_gauges_from_several_publishers_are_set_only_when_newer(tmp_path):
    """Two front ends' publishers over one clock file: a value recorded earlier never overwrites a later one."""
    first, second = GaugeClock(tmp_path / "gauges-at"), GaugeClock(tmp_path / "gauges-at")
    with first.newest(10.0) as newest:
        assert newest
    with second.newest(9.5) as newest:  # recorded before what the other already set: stale
        assert not newest
    with second.newest(10.5) as newest:
        assert newest
    with first.newest(10.5) as newest:  # the same moment again: nothing newer to set
        assert not newest


def _claim(path, at, results):
    with GaugeClock(path).newest(at) as newest:
        time.sleep(0.01)  # inside the lock: another process must wait, not interleave
        results.put((at, newest))


def test_the_clock_serialises_processes(tmp_path):
    path = tmp_path / "gauges-at"
    results = multiprocessing.get_context("fork").Queue()
    stamps = [float(i) for i in range(8)]
    processes = [multiprocessing.get_context("fork").Process(target=_claim, args=(path, at, results)) for at in stamps]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    claimed = [results.get(timeout=10) for _ in stamps]  # in the order the processes held the lock
    set_in_order = [at for at, newest in claimed if newest]
    assert set_in_order[-1] == max(stamps)  # the newest always lands last, whatever the order they came in
    assert set_in_order == sorted(set_in_order)  # what was set only ever went forward
