"""vLLM's stats published as Triton custom metrics, from one thread."""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any

import triton_python_backend_utils as pb_utils

from core.metrics import COUNTERS, GAUGES, HISTOGRAMS, GaugeClock, StatsBuffer


class TritonMetrics:
    """Publishes vLLM's stats as Triton custom metrics from ONE thread (see core/metrics.py for why)."""

    PUBLISH_SECONDS = 0.2

    def __init__(self, labels: dict[str, str], gauge_clock: GaugeClock | None = None) -> None:
        self.buffer = StatsBuffer()
        # Several front ends publish into the same metrics (Triton shares a name and labels between the core's
        # instances): their gauges are set newest-first (core/metrics.py GaugeClock).
        self._gauge_clock = gauge_clock
        kinds = pb_utils.MetricFamily
        # The families must outlive their metrics (Triton deletes a family's metrics with it): keep both.
        self._families: list[Any] = []

        def metric(name: str, doc: str, kind: Any, **extra: Any) -> Any:
            family = kinds(name=name, description=doc, kind=kind)
            self._families.append(family)
            return family.Metric(labels=labels, **extra)

        self._counters = {key: metric(name, doc, kinds.COUNTER) for key, (name, doc) in COUNTERS.items()}
        self._gauges = {key: metric(name, doc, kinds.GAUGE) for key, (name, doc) in GAUGES.items()}
        self._histograms = {
            key: metric(name, doc, kinds.HISTOGRAM, buckets=buckets) for key, (name, doc, buckets) in HISTOGRAMS.items()
        }
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._counters = self._gauges = self._histograms = {}  # metrics before their families
        self._families.clear()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.buffer.changed.wait(self.PUBLISH_SECONDS)
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - metrics must never take serving down
                pb_utils.Logger.log_error(f"vllm_core: publishing metrics failed: {traceback.format_exc()}")
            time.sleep(self.PUBLISH_SECONDS)  # batch the next engine steps into one publish

    def _publish(self) -> None:
        delta = self.buffer.drain()
        for key, value in delta.counters.items():
            if value:
                self._counters[key].increment(value)
        if delta.gauges is not None:
            if self._gauge_clock is None:
                self._set_gauges(delta.gauges)
            else:
                with self._gauge_clock.newest(delta.gauges_at) as newest:
                    if newest:
                        self._set_gauges(delta.gauges)
        for key, values in delta.samples.items():
            for value in values:
                self._histograms[key].observe(value)

    def _set_gauges(self, gauges: dict[str, float]) -> None:
        for key, value in gauges.items():
            self._gauges[key].set(value)
