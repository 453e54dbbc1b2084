"""Whether work on the other CPUs slows a Python loop on the EngineCore's CPU: one CPU at a time, then all at once.

    python tools/measure_cpu_interference.py [--cpu 0] [--window-ms 300] [--repeats 3] [--kinds spin,memory]

The GPU benchmark deployment places vLLM's EngineCore loop (a CPU-bound Python loop at the 1B shape) alone on one
CPU and every other process of the server on the rest (core.engine_cpus). Profiled beside the bare engine, ours'
EngineCore took longer per step with every part of its step longer alike, as if its CPU ran slower. A virtual
machine's CPUs can be two threads of one physical core (SMT siblings: the one's work slows the other) although the
guest's topology says otherwise, and many busy CPUs can lower the clock or fill the shared cache.

Here a loop of pure-Python work (dicts, lists, attribute lookups: the scheduler's kind of work) runs on `--cpu` and
counts its iterations in windows of `--window-ms`, taking turns with burner processes pinned to the other CPUs: each
window with the burners on is measured between two with them off (ABBA order), so a slow spell of the machine falls
on both. Burners: tools/bench.py's --background-load processes, one pinned to each CPU and paused between windows:
`spin` (a pure-Python loop: the core's execution units and the clock), `memory` (copies of 256 MiB: the shared cache
and memory bandwidth), `objects` (a Python server's allocation churn). Printed: the guest's own view of the
topology, then per CPU alone (spin) and for all the other CPUs together (each kind), the loop's rate with them on
over its rate with them off (median over the repeats and each repeat): near 1.0 means no interference; a CPU alone
near 0.6-0.8 is a sibling of `--cpu` on the host. Last, how much the loop's rate varied from window to window with
the burners off: the CPU's own noise, which a ratio must exceed to mean anything. No GPU, no vLLM; Linux only
(sched_setaffinity).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench import BACKGROUND_LOADS, BackgroundLoad, busy_processes  # noqa: E402

KINDS = tuple(BACKGROUND_LOADS)
WARM_UP_SECONDS = 0.5  # each burner's first run: the memory kind's buffers paged in before any window


class _Work:
    """The measured loop's work: the Python object churn of a scheduler step, small enough to count often."""

    def __init__(self) -> None:
        self.requests = [{"id": i, "tokens": list(range(i % 7)), "done": False} for i in range(64)]

    def step(self) -> int:
        ready = [r for r in self.requests if not r["done"]]
        ready.sort(key=lambda r: (len(r["tokens"]), r["id"]))
        for r in ready:
            r["tokens"].append(r["id"])
            if len(r["tokens"]) > 16:
                r["tokens"].clear()
        return len(ready)


def loop_rate(work: _Work, seconds: float) -> float:
    """Iterations of `work` per second over `seconds` of the calling thread's CPU."""
    count, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(20):
            work.step()
        count += 20
        now = time.perf_counter()
        if now >= end:
            return count / (now - start)


@dataclass
class Interference:
    label: str
    ratios: list[float]  # a repeat's rate with the burners on over the mean of the two windows beside it off
    idle_rates: list[float] = field(default_factory=list)  # the loop's rate in each window with the burners off

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)


def measure(
    label: str, burners: BackgroundLoad, work: _Work, window: float, repeats: int, settle: float
) -> Interference:
    """ABBA windows: each repeat's window with `burners` running between two with them paused; the ratio of its rate
    to their mean."""
    result = Interference(label, [])
    for _ in range(repeats):
        before = loop_rate(work, window)
        burners.run(True)
        time.sleep(settle)
        during = loop_rate(work, window)
        burners.run(False)
        time.sleep(settle)
        after = loop_rate(work, window)
        result.ratios.append(during / ((before + after) / 2))
        result.idle_rates += [before, after]
    return result


def topology(cpu: int) -> str:
    """The guest's view: cpu's siblings and core id, the model name (a VM may hide the host's SMT pairs)."""
    base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    facts = []
    for name in ("thread_siblings_list", "core_id", "physical_package_id"):
        path = base / name
        facts.append(f"{name}={path.read_text().strip() if path.exists() else '?'}")
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if "model name" in line), "?")
    return f"cpu {cpu}: " + " ".join(facts) + f"; {model}"


def run(cpu: int, window: float, repeats: int, kinds: Sequence[str], settle: float) -> list[Interference]:
    """The loop on `cpu`; for each kind, one burner (bench's --background-load process of that kind) on each other
    CPU, paused (SIGSTOP) but in the windows that measure it."""
    others = sorted(os.sched_getaffinity(0) - {cpu})
    os.sched_setaffinity(0, {cpu})
    work = _Work()
    results = []
    with contextlib.ExitStack() as stack:
        loads = {kind: stack.enter_context(busy_processes(len(others), kind, others)) for kind in kinds}
        time.sleep(WARM_UP_SECONDS)
        for load in loads.values():
            load.run(False)
        loop_rate(work, window)  # warm up: caches, the clock
        if "spin" in loads:
            for other, process in zip(others, loads["spin"].processes, strict=True):
                alone = BackgroundLoad([process])
                results.append(measure(f"cpu {other} (spin)", alone, work, window, repeats, settle))
        for kind, load in loads.items():
            results.append(measure(f"all {len(others)} ({kind})", load, work, window, repeats, settle))
    return results


def report(cpu: int, results: list[Interference]) -> str:
    lines = [topology(cpu), f"{'burners on':<22}{'rate on/off':>12}  repeats"]
    for result in results:
        each = " ".join(f"{r:.3f}" for r in result.ratios)
        lines.append(f"{result.label:<22}{result.median:>12.3f}  {each}")
    idle = [rate for result in results for rate in result.idle_rates]
    if idle:
        middle = statistics.median(idle)
        deciles = statistics.quantiles(idle, n=10, method="inclusive") if len(idle) > 1 else [middle] * 9
        lines.append(
            f"the loop alone ({len(idle)} windows, burners off), a window's rate over their median: "
            f"p10 {deciles[0] / middle:.3f}, p90 {deciles[-1] / middle:.3f}, "
            f"lowest {min(idle) / middle:.3f}, highest {max(idle) / middle:.3f} (the CPU's own noise)"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", type=int, default=0, help="the measured loop's CPU (core.engine_cpus' one)")
    parser.add_argument("--window-ms", type=float, default=300.0)
    parser.add_argument("--settle-ms", type=float, default=30.0, help="after switching the burners, before measuring")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    args = parser.parse_args(argv)
    unknown = set(args.kinds) - set(KINDS)
    if unknown:
        parser.error(f"--kinds: unknown {sorted(unknown)}; known: {', '.join(KINDS)}")
    if args.cpu not in os.sched_getaffinity(0):
        parser.error(f"--cpu {args.cpu}: not a CPU this process may run on ({sorted(os.sched_getaffinity(0))})")
    results = run(args.cpu, args.window_ms / 1000, args.repeats, args.kinds, args.settle_ms / 1000)
    print(report(args.cpu, results))


if __name__ == "__main__":
    main()
