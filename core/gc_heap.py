"""Python's garbage collector in a long-lived serving process: the startup heap frozen, and its runs counted.

Each collection holds the GIL, so a long one stalls the whole stub: no response sent, no request taken in. A stub
that imported torch, transformers and vLLM tracks ~600k objects; one full collection of them took 285 ms on the
2-core CPU machine, and on the H100 the core's stub ran one of 315 ms in the middle of a 256-stream level
(`tools/bench.py --profile`, docs/performance-gpu.md). `vllm serve` freezes its startup heap for this reason
(vLLM's `freeze_gc_heap`); `freeze_startup_heap` does the same for every stub once it is set up, so a full
collection only walks what was made while serving. Frozen objects are never collected by the cycle collector (their
reference counts still free them), which is what startup state (modules, the engine, the tokenizer) wants.
`TRITON_VLLM_GC_FREEZE=0` in tritonserver's environment leaves the heap unfrozen, to measure the difference.
Triton-free.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from dataclasses import dataclass

FREEZE_ENVIRONMENT_KEY = "TRITON_VLLM_GC_FREEZE"


def freeze_startup_heap(switchable: bool = True) -> int:
    """Collect what startup left behind, then move every tracked object out of the collector's sight.

    Call once the process has loaded everything it serves with. Returns how many objects are frozen (0 when
    `switchable` and TRITON_VLLM_GC_FREEZE=0).
    """
    if switchable and os.environ.get(FREEZE_ENVIRONMENT_KEY, "1").strip() == "0":
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_heap() -> None:
    """Give the frozen objects back to the collector (before replacing what was frozen, e.g. a dead engine)."""
    gc.unfreeze()


@dataclass
class GcSnapshot:
    full_collections: int = 0
    full_ms: float = 0.0  # the time the full collections took together
    full_max_ms: float = 0.0
    young_collections: int = 0  # generations 0 and 1
    young_ms: float = 0.0

    def describe(self) -> str:
        return (
            f"gc: {self.full_collections} full collections ({self.full_ms:.0f} ms, longest {self.full_max_ms:.0f}"
            f" ms), {self.young_collections} young ({self.young_ms:.0f} ms)"
        )


class GcPauses:
    """Counts the collector's runs and their time (gc.callbacks), per interval, until `stop`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started: float | None = None
        self._totals = GcSnapshot()
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        # The collector runs with the GIL held, on whichever thread allocated: start and stop pair up.
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        ms = (time.perf_counter() - self._started) * 1000
        self._started = None
        with self._lock:
            totals = self._totals
            if info.get("generation") == 2:
                totals.full_collections += 1
                totals.full_ms += ms
                totals.full_max_ms = max(totals.full_max_ms, ms)
            else:
                totals.young_collections += 1
                totals.young_ms += ms

    def snapshot(self) -> GcSnapshot:
        """The counts since the last snapshot (and reset them)."""
        with self._lock:
            totals, self._totals = self._totals, GcSnapshot()
        return totals

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
