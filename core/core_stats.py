"""Opt-in counters of the core's own work, logged every few seconds: where a busy core stub spends its time.

Set `TRITON_VLLM_CORE_STATS_SECONDS` (e.g. 5) in tritonserver's environment to log, per interval: requests
taken in (and in how many `execute` calls), responses sent and the mean and p99 time one send took, and for each
request's first response where its time went inside the core: from `execute` to vLLM's first output ("engine"),
from there until a sender thread started sending it ("queued"), and the send itself. A send is a round trip to
tritonserver with the GIL released, so its time also shows how long a sender thread waited to get the GIL back.
And the engine's own steps (core/step_stats.py: its batch, steps per second) and the trips to and from the
EngineCore by its clock (core/engine_lags.py), for which the core turns vLLM's statistics on, and the garbage
collector's runs in the core's process (core/gc_heap.py). `tools/bench.py --profile` and
`tools/trace_timeline.py` turn it on. Triton-free (the logger is any object with `log_info`).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Hashable
from typing import Any

from core.engine_lags import EngineLags
from core.gc_heap import GcPauses
from core.step_stats import EngineSteps

ENVIRONMENT_KEY = "TRITON_VLLM_CORE_STATS_SECONDS"
LOG_MARK = "vllm_core stats: "  # what starts the counters' log line (tools/bench.py keeps these lines per level)


class CoreStats:
    def __init__(
        self,
        logger: Any,
        interval: float,
        steps: EngineSteps | None = None,
        lags: EngineLags | None = None,
        source: str = "",
    ) -> None:
        self._logger = logger
        # Which of several front ends (core/front_ends.py) logs, at the end of its lines; "" with one.
        self._suffix = f" ({source})" if source else ""
        self._interval = interval
        self._steps = steps
        self._lags = lags
        self._gc = GcPauses()
        self._lock = threading.Lock()
        # request -> [admitted, first output from vLLM or None], until its first response is sent
        self._pending_first: dict[Hashable, list[float | None]] = {}
        self._reset()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-core-stats", daemon=True)
        self._thread.start()

    @staticmethod
    def seconds_from_environment() -> float:
        return float(os.environ.get(ENVIRONMENT_KEY, "0") or 0)

    @classmethod
    def from_environment(
        cls, logger: Any, steps: EngineSteps | None = None, lags: EngineLags | None = None, source: str = ""
    ) -> CoreStats | None:
        seconds = cls.seconds_from_environment()
        return cls(logger, seconds, steps, lags, source) if seconds > 0 else None

    def _reset(self) -> None:
        self._executes = 0
        self._requests = 0
        self._send_times: list[float] = []
        self._first: dict[str, list[float]] = {"engine": [], "queued": [], "send": []}

    def executed(self, requests: int) -> None:
        with self._lock:
            self._executes += 1
            self._requests += requests

    def admitted(self, request: Hashable) -> None:
        """A request entered the core (from `execute`)."""
        with self._lock:
            self._pending_first[request] = [time.perf_counter(), None]

    def emitted(self, request: Hashable) -> None:
        """vLLM gave the request an output (the engine loop's thread); only the first one counts."""
        with self._lock:
            entry = self._pending_first.get(request)
            if entry is not None and entry[1] is None:
                entry[1] = time.perf_counter()

    def sent(self, seconds: float, request: Hashable | None = None) -> None:
        """A send that took `seconds` ended now; the request's first one completes its first-response record."""
        now = time.perf_counter()
        with self._lock:
            self._send_times.append(seconds)
            entry = self._pending_first.pop(request, None) if request is not None else None
            if entry is not None and entry[1] is not None:
                admitted, emitted = entry
                self._first["engine"].append(emitted - admitted)
                self._first["queued"].append(now - seconds - emitted)
                self._first["send"].append(seconds)

    def snapshot(self) -> dict[str, float]:
        """The counters since the last snapshot (and reset them)."""
        with self._lock:
            executes, requests, times, first = self._executes, self._requests, self._send_times, self._first
            self._reset()
        ordered = sorted(times)
        snap = {
            "executes": executes,
            "requests": requests,
            "sends": len(times),
            "send_mean_ms": 1000 * sum(times) / len(times) if times else 0.0,
            "send_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0,
            "firsts": len(first["send"]),
        }
        for part, values in first.items():
            snap[f"first_{part}_p50_ms"] = 1000 * statistics.median(values) if values else 0.0
        return snap

    def _run(self) -> None:
        while not self._stopping.wait(self._interval):
            if self._steps is not None and (steps := self._steps.snapshot()).counted:
                self._logger.log_info(f"vllm_core {steps.describe()}")
            if self._lags is not None and ((lags := self._lags.snapshot()).requests or lags.outputs):
                self._logger.log_info(f"vllm_core {lags.describe()}")
            snap = self.snapshot()
            collected = self._gc.snapshot()
            if snap["sends"] or snap["requests"] or collected.full_collections:
                self._logger.log_info(f"vllm_core {collected.describe()}")
            if snap["sends"] or snap["requests"]:
                rate = {key: value / self._interval for key, value in snap.items() if key in ("sends", "requests")}
                self._logger.log_info(
                    f"{LOG_MARK}{rate['requests']:.0f} requests/s in {snap['executes']} execute calls,"
                    f" {rate['sends']:.0f} responses/s, send {snap['send_mean_ms']:.2f} ms mean"
                    f" {snap['send_p99_ms']:.2f} ms p99; first responses ({snap['firsts']}), p50:"
                    f" engine {snap['first_engine_p50_ms']:.2f} ms, queued {snap['first_queued_p50_ms']:.2f} ms,"
                    f" send {snap['first_send_p50_ms']:.2f} ms{self._suffix}"
                )

    def stop(self) -> None:
        self._stopping.set()
        self._gc.stop()
