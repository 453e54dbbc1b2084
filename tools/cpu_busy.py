"""How many CPUs were busy at once while each benchmark measurement ran (tools/bench.py --cpu-busy), and a report.

    .venv/bin/python tools/cpu_busy.py FILE... [--paths bare,plain-grpc] [--min-streams 64]

At 256 streams in waves a wave's 256 answers leave and 256 requests arrive within tens of milliseconds. Ours does a
few milliseconds of CPU work per request there, in several processes (Triton, the plain stubs, the benchmark's
clients); the bare engine's client a tenth of a millisecond in one. Whether those moments fill every CPU of the
machine (then less work per request is what shortens them) or leave CPUs idle (then the work waits on something
else: a stub's interpreter lock, a queue) is read here: a thread reads /proc/stat every SAMPLE_MS and each
measurement keeps, over the CPUs the engine's loop does not own, how many were busy per interval: the mean, the
busiest intervals, the share of intervals with nearly all of them busy and the longest such stretch. /proc/stat
counts in clock ticks (10 ms on Linux), so one interval of one CPU reads 0, a half or 1: the figures are over many
intervals; a level shorter than two readings (~40 ms) gets none. No /proc/stat: nothing is sampled, nothing
recorded. Triton-free and vLLM-free.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.machine_facts import busy_ticks, read_cpu_times  # noqa: E402

SAMPLE_MS = 20
# An interval counts as saturated when at least this share of the CPUs counted were busy through it
SATURATED = 0.9


@dataclass(frozen=True)
class Sample:
    at: float  # time.time() when read
    ticks: dict[int, tuple[int, int]]  # CPU -> (busy ticks, all ticks) so far


def reading(at: float, times: dict[str, list[int]]) -> Sample:
    return Sample(at, {int(cpu): (busy_ticks(columns), sum(columns)) for cpu, columns in times.items()})


def busy_per_interval(samples: Sequence[Sample], excluded: Collection[int] = ()) -> list[float]:
    """Between each two consecutive samples: how many of the CPUs not `excluded` were busy (each CPU's busy share of
    its own ticks in that interval; a CPU that counted no tick there adds nothing)."""
    out = []
    for before, after in zip(samples, samples[1:], strict=False):
        busy = 0.0
        for cpu, (busy_now, total_now) in after.ticks.items():
            if cpu in excluded or cpu not in before.ticks:
                continue
            busy_then, total_then = before.ticks[cpu]
            if total_now > total_then:
                busy += (busy_now - busy_then) / (total_now - total_then)
        out.append(busy)
    return out


def summarize(samples: Sequence[Sample], excluded: Collection[int] = ()) -> dict[str, Any] | None:
    """A measurement's samples in a few numbers (None with fewer than two samples)."""
    busy = busy_per_interval(samples, excluded)
    if not busy:
        return None
    cpus = len([cpu for cpu in samples[0].ticks if cpu not in excluded])
    saturated = [value >= SATURATED * cpus for value in busy]
    longest = run = 0
    for flag in saturated:
        run = run + 1 if flag else 0
        longest = max(longest, run)
    interval_ms = 1000 * (samples[-1].at - samples[0].at) / len(busy)
    ordered = sorted(busy)
    return {
        "cpus": cpus,
        "excluded": sorted(excluded),
        "intervals": len(busy),
        "interval_ms": round(interval_ms, 1),
        "mean_busy": round(statistics.fmean(busy), 2),
        "p90_busy": round(ordered[int(0.9 * (len(ordered) - 1))], 2),
        "p99_busy": round(ordered[int(0.99 * (len(ordered) - 1))], 2),
        "saturated_share": round(sum(saturated) / len(busy), 4),
        "longest_saturated_ms": round(longest * interval_ms),
    }


class CpuBusySampler:
    """/proc/stat read every SAMPLE_MS in a thread while the benchmark runs; `take(start, end)` gives the samples of
    a time window and forgets every sample up to its end (the benchmark's windows come one after the other), so a
    long run does not keep them all."""

    def __init__(self, sample_ms: int = SAMPLE_MS) -> None:
        self.sample_ms = sample_ms
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Sampling from now on; False (and nothing sampled) where /proc/stat has no per-CPU lines."""
        if not read_cpu_times():
            return False
        self._thread = threading.Thread(target=self._run, name="cpu-busy", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        period = self.sample_ms / 1000
        next_at = time.monotonic()
        while not self._stop.is_set():
            sample = reading(time.time(), read_cpu_times())
            with self._lock:
                self.samples.append(sample)
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def take(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            window = [sample for sample in self.samples if start <= sample.at <= end]
            self.samples = [sample for sample in self.samples if sample.at > end]
        return window


def describe(summary: dict[str, Any]) -> str:
    return (
        f"busy CPUs of {summary['cpus']}: mean {summary['mean_busy']:.1f}, p90 {summary['p90_busy']:.1f}, "
        f"p99 {summary['p99_busy']:.1f}; >= {SATURATED:.0%} busy {100 * summary['saturated_share']:.1f} % of "
        f"{summary['intervals']} intervals of {summary['interval_ms']:.0f} ms, "
        f"longest {summary['longest_saturated_ms']} ms"
    )


def main(argv: list[str] | None = None) -> int:
    from tools.bench_results import runs_of
    from tools.pair_spread import read

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--paths", help="comma-separated paths (default: every path with readings)")
    parser.add_argument("--min-streams", type=int, default=1)
    args = parser.parse_args(argv)
    wanted = set(args.paths.split(",")) if args.paths else None
    shown = 0
    for path in args.files:
        runs = [
            run
            for run in runs_of(read(path))
            if run.cpu_busy and run.concurrency >= args.min_streams and (wanted is None or run.path in wanted)
        ]
        if not runs:
            continue
        print(path)
        runs.sort(key=lambda run: (run.max_tokens, run.concurrency, run.round_id, run.turn_index or 0))
        for run in runs:
            tokens = run.output_tokens / run.wall
            label = f"{run.max_tokens} x {run.concurrency} round {run.round_id} {run.path}"
            print(f"  {label:<44} {tokens:>8.0f} tok/s  {describe(run.cpu_busy)}")
            shown += 1
    if not shown:
        print("cpu_busy: no measurement in these files has CPU readings (tools/bench.py --cpu-busy)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
