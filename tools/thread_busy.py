"""Which threads of a running process are busy, and for how long at a stretch (Linux).

    python tools/thread_busy.py PID [--seconds 10] [--period 0.01] [--top 12] [--pick-seconds 5]

Each thread's CPU comes from /proc/PID/task/TID/schedstat (nanoseconds on the CPU, not the 10 ms ticks of `stat`).
It reads every thread once, waits --pick-seconds, and keeps the --top threads that used the most CPU meanwhile (a
server has thousands of idle threads: tritonserver starts its Python backend's pool for every model instance); then
it reads those every --period for --seconds and prints, per thread: its name and id, its mean share of a CPU, how
many windows it was at least 90 % busy, and its longest run of such windows. Start it while the load runs
(e.g. beside a `tools/bench.py` level of many streams). A thread that serializes a burst of work, as Triton 2.51's
two gRPC handler threads may at a wave's boundary (docs/performance-gpu.md, session 65), shows as runs of full
windows; the mean over seconds hides them. With `tools/bench.py --interleave` the paths take turns every 1-3 s,
so the picking should span a whole turn (the default 5 s: about one turn of four paths at 256 streams): one second
may fall on a path that leaves the server idle (the bare engine's), and the threads picked then are the idle ones.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

BUSY = 0.9  # a window in which a thread was on a CPU at least this share of the time counts as full


def run_ns(pid: int, tid: int) -> int | None:
    """The thread's time on a CPU so far in nanoseconds, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat") as file:
            return int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as file:
            return file.read().strip()
    except OSError:
        return "?"


def busiest_threads(pid: int, seconds: float, top: int) -> list[int]:
    """The `top` threads that spent the most time on a CPU over `seconds`, busiest first."""

    def every() -> dict[int, int]:
        times = {}
        for entry in os.listdir(f"/proc/{pid}/task"):
            value = run_ns(pid, int(entry))
            if value is not None:
                times[int(entry)] = value
        return times

    before = every()
    time.sleep(seconds)
    after = every()
    used = {tid: value - before.get(tid, 0) for tid, value in after.items()}
    return sorted(used, key=lambda tid: used[tid], reverse=True)[:top]


def sample(pid: int, tids: list[int], seconds: float, period: float) -> dict[int, list[float]]:
    """Each thread's share of a CPU in every window of about `period` seconds over `seconds` (a thread that ended
    keeps the windows it had)."""
    shares: dict[int, list[float]] = {tid: [] for tid in tids}
    previous = {tid: run_ns(pid, tid) for tid in tids}
    last = time.monotonic()
    end = last + seconds
    while last < end:
        time.sleep(period)
        now = time.monotonic()
        for tid in tids:
            current = run_ns(pid, tid)
            if current is not None and previous[tid] is not None:
                shares[tid].append((current - previous[tid]) / 1e9 / (now - last))
            previous[tid] = current
        last = now
    return shares


@dataclass(frozen=True)
class ThreadBusy:
    mean: float  # share of a CPU over all windows
    full_windows: int  # windows at least BUSY
    windows: int
    longest_full_run: int  # consecutive full windows


def summarize(shares: list[float]) -> ThreadBusy:
    run = longest = 0
    for share in shares:
        run = run + 1 if share >= BUSY else 0
        longest = max(longest, run)
    mean = sum(shares) / len(shares) if shares else 0.0
    return ThreadBusy(mean, sum(share >= BUSY for share in shares), len(shares), longest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pid", type=int)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to sample the picked threads")
    parser.add_argument("--period", type=float, default=0.01, help="seconds a window")
    parser.add_argument("--top", type=int, default=12, help="how many of the busiest threads to sample")
    parser.add_argument("--pick-seconds", type=float, default=5.0, help="how long to watch every thread to pick them")
    args = parser.parse_args(argv)
    if not os.path.exists(f"/proc/{args.pid}/task"):
        parser.error(f"no process {args.pid}")
    tids = busiest_threads(args.pid, args.pick_seconds, args.top)
    shares = sample(args.pid, tids, args.seconds, args.period)
    window_ms = 1000 * args.period
    print(f"{len(tids)} busiest threads of {args.pid} over {args.seconds:g} s, windows of ~{window_ms:g} ms:")
    for tid in tids:
        busy = summarize(shares[tid])
        print(
            f"  {thread_name(args.pid, tid):16s} {tid:>8d}  mean {busy.mean:.3f} of a CPU, at least"
            f" {100 * BUSY:.0f} % busy in {busy.full_windows} of {busy.windows} windows, longest run"
            f" {busy.longest_full_run} windows"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
