"""Whether work on the other CPUs slows a Python loop on the EngineCore's CPU: one CPU at a time, then all at once.

    python tools/measure_cpu_interference.py [--cpu 0] [--window-ms 300] [--repeats 3] [--kinds spin,memory]

The GPU benchmark deployment places vLLM's EngineCore loop (a CPU-bound Python loop at the 1B shape) alone on one
CPU and every other process of the server on the rest (core.engine_cpus). Profiled beside the bare engine, ours'
EngineCore took longer per step with every part of its step longer alike, as if its CPU ran slower. A virtual
machine's CPUs can be two threads of one physical core (SMT siblings: the one's work slows the other) although the
guest's topology says otherwise, and many busy CPUs can lower the clock or fill the shared cache.

Here a loop of pure-Python work (dicts, lists, attribute lookups: the scheduler's kind of work) runs on `--cpu` and
counts its iterations in windows of `--window-ms`, taking turns with burner processes pinned to the other CPUs:
each window with the burners on is measured between two with them off (ABBA order), so a slow spell of the machine
falls on both. Burners: `spin` (a pure-Python loop: the core's execution units and the clock), `memory` (numpy
copies of 64 MiB arrays: the shared cache and memory bandwidth). Printed: the guest's own view of the topology, then
per CPU alone (spin) and for all the other CPUs together (each kind), the loop's rate with them on over its rate with
them off (median over the repeats and each repeat): near 1.0 means no interference; a CPU alone near 0.6-0.8 is a
sibling of `--cpu` on the host. Last, how much the loop's rate varied from window to window with the burners off:
the CPU's own noise, which a ratio must exceed to mean anything. No GPU, no vLLM; Linux only (sched_setaffinity).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("spin", "memory")
MEMORY_BYTES = 64 * 1024 * 1024


def _spin_chunk() -> int:
    total = 0
    for i in range(20000):
        total += i * i % 7
    return total


def _burner(cpu: int, on: Any, kind: Any) -> None:
    """In its own process on `cpu`: idle until `on` is set, then the kind of work `kind` names until it is cleared."""
    os.sched_setaffinity(0, {cpu})
    source = target = None
    while True:
        on.wait()
        if kind.value == KINDS.index("memory"):
            if source is None:
                import numpy as np

                source = np.ones(MEMORY_BYTES, dtype=np.uint8)
                target = np.empty_like(source)
            while on.is_set():
                target[:] = source
        else:
            while on.is_set():
                _spin_chunk()


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


class Burners:
    """One idle burner process per CPU, started once; `run(cpus, kind)` sets those CPUs' burners to work."""

    def __init__(self, cpus: Sequence[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self.kind = context.Value("i", 0)
        self.switches = {cpu: context.Event() for cpu in cpus}
        self.processes = [
            context.Process(target=_burner, args=(cpu, self.switches[cpu], self.kind), daemon=True) for cpu in cpus
        ]
        for process in self.processes:
            process.start()

    def set(self, cpus: Sequence[int], kind: str) -> None:
        self.kind.value = KINDS.index(kind)
        for cpu in cpus:
            self.switches[cpu].set()

    def clear(self) -> None:
        for switch in self.switches.values():
            switch.clear()

    def close(self) -> None:
        for process in self.processes:
            process.kill()


def measure(
    label: str,
    burners: Burners,
    work: _Work,
    cpus: Sequence[int],
    kind: str,
    window: float,
    repeats: int,
    settle: float,
) -> Interference:
    """ABBA windows: each repeat's on-window between two off-windows; the ratio of its rate to their mean."""
    result = Interference(label, [])
    for _ in range(repeats):
        before = loop_rate(work, window)
        burners.set(cpus, kind)
        time.sleep(settle)
        during = loop_rate(work, window)
        burners.clear()
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
    others = sorted(os.sched_getaffinity(0) - {cpu})
    os.sched_setaffinity(0, {cpu})
    burners = Burners(others)
    work = _Work()
    results = []
    try:
        loop_rate(work, window)  # warm up: caches, the clock
        plan = [(f"cpu {other} (spin)", [other], "spin") for other in others if "spin" in kinds]
        plan += [(f"all {len(others)} ({kind})", others, kind) for kind in kinds]
        results += [measure(label, burners, work, cpus, kind, window, repeats, settle) for label, cpus, kind in plan]
    finally:
        burners.clear()
        burners.close()
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
