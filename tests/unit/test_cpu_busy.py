"""tools/cpu_busy.py: /proc/stat readings turned into busy CPUs per interval, a measurement summed up, the sampler run
on this machine's own /proc/stat, and the report over a results file."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tools.cpu_busy import CpuBusySampler, Sample, busy_per_interval, main, reading, summarize


def ticks(*busy_total: tuple[int, int]) -> dict[int, tuple[int, int]]:
    return dict(enumerate(busy_total))


def test_a_reading_counts_idle_iowait_and_steal_as_not_busy():
    # user nice system idle iowait irq softirq steal
    sample = reading(5.0, {"0": [10, 1, 4, 100, 3, 1, 1, 2], "1": [0, 0, 0, 50, 0, 0, 0, 0]})
    assert sample == Sample(5.0, {0: (17, 122), 1: (0, 50)})


def test_each_interval_counts_the_busy_share_of_the_cpus_not_excluded():
    samples = [
        Sample(0.00, ticks((0, 0), (0, 0), (0, 0))),
        Sample(0.02, ticks((2, 2), (2, 2), (1, 2))),  # CPU 0 busy, CPU 1 busy, CPU 2 half
        Sample(0.04, ticks((4, 4), (2, 4), (1, 2))),  # CPU 1 idle; CPU 2 counted no tick: adds nothing
    ]
    assert busy_per_interval(samples) == [2.5, 1.0]
    assert busy_per_interval(samples, excluded=[0]) == [1.5, 0.0]
    assert busy_per_interval(samples[:1]) == []


def test_a_summary_names_the_saturated_share_and_its_longest_stretch():
    # 10 CPUs, CPU 0 the engine's: 9 counted; intervals of 20 ms with 9, 9, 2, 9 and 3 of them busy
    counts = [9, 9, 2, 9, 3]
    samples, busy = [], [0] * 10
    samples.append(Sample(0.0, {cpu: (0, 0) for cpu in range(10)}))
    for i, count in enumerate(counts, start=1):
        busy = [b + (2 if 1 <= cpu <= count else 0) for cpu, b in enumerate(busy)]
        samples.append(Sample(0.02 * i, {cpu: (busy[cpu], 2 * i) for cpu in range(10)}))
    summary = summarize(samples, excluded=[0])
    assert summary == {
        "cpus": 9,
        "excluded": [0],
        "intervals": 5,
        "interval_ms": 20.0,
        "mean_busy": 6.4,
        "p90_busy": 9.0,
        "p99_busy": 9.0,
        "saturated_share": 0.6,
        "longest_saturated_ms": 40,
    }
    assert summarize(samples[:1]) is None


def test_the_sampler_reads_this_machines_proc_stat():
    sampler = CpuBusySampler(sample_ms=10)
    start = time.time()
    assert sampler.start()
    deadline = time.monotonic() + 5
    while len(sampler.samples) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    end = time.time()
    samples = sampler.take(start, end)
    assert len(samples) >= 4
    assert sampler.samples == [] and sampler.take(start, end) == []  # a window taken is forgotten
    assert [s.at for s in samples] == sorted(s.at for s in samples)
    summary = summarize(samples)
    assert summary is not None and summary["cpus"] == len(samples[0].ticks) >= 1
    assert 0 <= summary["mean_busy"] <= summary["cpus"]


def test_the_report_lists_each_measurement_with_readings(tmp_path: Path, capsys):
    reading_of = {
        "cpus": 15,
        "excluded": [0],
        "intervals": 300,
        "interval_ms": 20.0,
        "mean_busy": 3.2,
        "p90_busy": 9.5,
        "p99_busy": 14.0,
        "saturated_share": 0.02,
        "longest_saturated_ms": 60,
    }
    base = {
        "max_tokens": 64,
        "concurrency": 256,
        "rep": 0,
        "requests": 2048,
        "wall": 6.0,
        "output_tokens": 131072,
        "cpu_seconds": None,
        "round_id": "0.0",
    }
    runs = [{**base, "path": "bare", "cpu_busy": reading_of}, {**base, "path": "plain-grpc", "cpu_busy": None}]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": runs}))
    assert main([str(results)]) == 0
    out = capsys.readouterr().out
    assert "bare" in out and "21845 tok/s" in out and "mean 3.2, p90 9.5, p99 14.0" in out
    assert ">= 90% busy 2.0 % of 300 intervals of 20 ms, longest 60 ms" in out
    assert "plain-grpc" not in out  # no readings
    assert main([str(results), "--paths", "plain-grpc"]) == 1
