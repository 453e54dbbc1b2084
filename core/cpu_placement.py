"""Optional CPU placement of vLLM's engine processes (deployment key `core.engine_cpus`).

At a small model's size vLLM's EngineCore is a CPU-bound Python loop (its scheduler runs between every GPU
step), and on a busy host other processes migrating onto its CPU slow every step. Measured on an H100 host
(docs/performance-gpu.md): the EngineCore on a CPU of its own and everything else on the others made both the
bare engine and our server faster. vLLM has no such setting on CUDA, so the core does it: in every process under
a root (the server) whose title is vLLM's (`VLLM::EngineCore`, tensor-parallel workers) and that belongs to this
engine, the main thread (the busy loop) is pinned to the engine's CPUs and the process's other threads (its
socket I/O threads, torch's helpers) to the remaining ones, as is every other process under the root with all
its threads. The helper threads use little CPU (3-7 % of the process's), but on the loop's CPU each of their
wake-ups must wait for the loop or preempt it (our reading, not traced); off it, streamed tok/s rose 1.08x on an
H100 (median of 9 paired runs, all 9 higher). Threads and processes started later inherit their creator's mask,
so one pass after each engine start holds. Linux only (/proc, sched_setaffinity). Triton-free: tools/bench.py
places the bare engine and `vllm serve` the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection
from pathlib import Path

ENGINE_TITLE_PREFIX = b"VLLM::"  # vLLM names its engine processes so (setproctitle): EngineCore, Worker_TP0, ...


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in parentheses may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def process_tree(root: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """`root` and every process below it (in `children`, a snapshot of /proc, when given)."""
    children = _children_map() if children is None else children
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def is_engine_process(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(ENGINE_TITLE_PREFIX)
    except OSError:
        return False


def pin_process(pid: int, cpus: Collection[int], main_thread_cpus: Collection[int] | None = None) -> None:
    """Every thread of `pid` to `cpus`, its main thread to `main_thread_cpus` when given (sched_setaffinity on a
    pid sets one thread only)."""
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in threads:
        mask = main_thread_cpus if tid == pid and main_thread_cpus is not None else cpus
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(tid, mask)


def _placed_main_thread(pid: int) -> frozenset[int] | None:
    """The CPUs of a process's main thread where they differ from its other threads' (a placed engine), else None."""
    try:
        masks = {int(tid): frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}
    except OSError:  # gone meanwhile
        return None
    main = masks.pop(pid, None)
    return main if main is not None and masks and main not in masks.values() else None


class EnginePlacement:
    """The engine's CPUs, and the rest: the CPUs this process may use (the server's, e.g. as `taskset` started
    it) without the engine's."""

    def __init__(self, engine_cpus: Collection[int]) -> None:
        self.engine_cpus = frozenset(engine_cpus)
        unknown = sorted(cpu for cpu in self.engine_cpus if cpu >= (os.cpu_count() or 1))
        if unknown:
            raise ValueError(f"core.engine_cpus: this machine has no CPU {unknown} ({os.cpu_count()} CPUs)")
        self.other_cpus = frozenset(os.sched_getaffinity(0) - self.engine_cpus)
        if not self.other_cpus:
            raise ValueError("core.engine_cpus: leave at least one of the server's CPUs to its other processes")

    def apply(self, root: int, engine_root: int | None = None) -> tuple[list[int], list[int]]:
        """Place every process under `root`: the main threads of vLLM's engine processes under `engine_root`
        (default: `root`) on the engine's CPUs, every other thread off them. Another deployment's engine in the
        same server that its own core placed already (its main thread's CPUs differ from its other threads')
        keeps its main thread's CPUs, and nothing else is put there: each core's pass would otherwise move the
        engines placed before it (one server measuring two deployments side by side, tools/bench.py
        --also-deployment). Returns (this engine's pids, every other pid). An engine CPU this machine does not
        let us use (outside the container's cpuset) raises OSError."""
        children = _children_map()
        tree = process_tree(root, children)
        engine_tree = tree if engine_root is None else process_tree(engine_root, children)
        engine = [pid for pid in engine_tree if is_engine_process(pid)]
        other = [pid for pid in tree if pid not in engine]
        placed = {pid: cpus for pid in other if is_engine_process(pid) and (cpus := _placed_main_thread(pid))}
        reserved = self.engine_cpus.union(*placed.values())
        rest = (self.other_cpus - reserved) or self.other_cpus
        for pid in other:
            pin_process(pid, rest, main_thread_cpus=placed.get(pid))
        for pid in engine:
            pin_process(pid, rest, main_thread_cpus=self.engine_cpus)
        return engine, other

    def describe(self) -> str:
        return f"the engine's main threads on CPUs {sorted(self.engine_cpus)}, the rest on {sorted(self.other_cpus)}"
