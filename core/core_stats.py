"""Opt-in counters of the core's own work, logged every few seconds: where a busy core stub spends its time.

Set `TRITON_VLLM_CORE_STATS_SECONDS` (e.g. 5) in tritonserver's environment to log, per interval: requests
taken in (and in how many `execute` calls), responses sent and the mean and p99 time one send took. A send is a
round trip to tritonserver with the GIL released, so its time also shows how long a sender thread waited to get
the GIL back. `tools/bench.py --profile` turns it on. Triton-free (the logger is any object with `log_info`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

ENVIRONMENT_KEY = "TRITON_VLLM_CORE_STATS_SECONDS"


class CoreStats:
    def __init__(self, logger: Any, interval: float) -> None:
        self._logger = logger
        self._interval = interval
        self._lock = threading.Lock()
        self._reset()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-core-stats", daemon=True)
        self._thread.start()

    @classmethod
    def from_environment(cls, logger: Any) -> CoreStats | None:
        seconds = float(os.environ.get(ENVIRONMENT_KEY, "0") or 0)
        return cls(logger, seconds) if seconds > 0 else None

    def _reset(self) -> None:
        self._executes = 0
        self._requests = 0
        self._send_times: list[float] = []

    def executed(self, requests: int) -> None:
        with self._lock:
            self._executes += 1
            self._requests += requests

    def sent(self, seconds: float) -> None:
        with self._lock:
            self._send_times.append(seconds)

    def snapshot(self) -> dict[str, float]:
        """The counters since the last snapshot (and reset them)."""
        with self._lock:
            executes, requests, times = self._executes, self._requests, self._send_times
            self._reset()
        ordered = sorted(times)
        return {
            "executes": executes,
            "requests": requests,
            "sends": len(times),
            "send_mean_ms": 1000 * sum(times) / len(times) if times else 0.0,
            "send_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else 0.0,
        }

    def _run(self) -> None:
        while not self._stopping.wait(self._interval):
            snap = self.snapshot()
            if snap["sends"] or snap["requests"]:
                rate = {key: value / self._interval for key, value in snap.items() if key in ("sends", "requests")}
                self._logger.log_info(
                    f"vllm_core stats: {rate['requests']:.0f} requests/s in {snap['executes']} execute calls,"
                    f" {rate['sends']:.0f} responses/s, send {snap['send_mean_ms']:.2f} ms mean"
                    f" {snap['send_p99_ms']:.2f} ms p99"
                )

    def stop(self) -> None:
        self._stopping.set()
