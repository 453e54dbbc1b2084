"""vLLM's engine statistics, gathered for Triton's /metrics (the `vllm:` families).

vLLM calls a stat logger's `record()` on its output-handler task after every engine step. Publishing there
would put Triton IPC (one round trip per metric update) on the engine's event loop, and Triton 2.51 custom
metrics updated from several threads at once crashed the server in a probe. So `record()` only adds to a
`StatsBuffer` under a lock, and ONE publisher thread (core/adapters/metrics_publisher.py) drains it into Triton's
metrics.
This module is Triton-free, so unit tests reach it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# (name, description); the names follow vLLM's own Prometheus metrics.
COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    "generation_tokens": ("vllm:generation_tokens_total", "Number of generation tokens processed."),
    "request_success": ("vllm:request_success_total", "Number of finished requests (any finish reason)."),
    "preemptions": ("vllm:num_preemptions_total", "Number of preemptions."),
}
GAUGES = {
    "running": ("vllm:num_requests_running", "Number of requests in model execution batches."),
    "waiting": ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
}
_LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
_TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
HISTOGRAMS = {
    "time_to_first_token": (
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        _LATENCY_BUCKETS,
    ),
    "time_per_output_token": (
        "vllm:time_per_output_token_seconds",
        "Histogram of the mean time per output token of each request, in seconds.",
        _LATENCY_BUCKETS,
    ),
    "e2e_request_latency": (
        "vllm:e2e_request_latency_seconds",
        "Histogram of end-to-end request latency in seconds.",
        [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
    ),
    "request_prompt_tokens": ("vllm:request_prompt_tokens", "Number of prefill tokens per request.", _TOKEN_BUCKETS),
    "request_generation_tokens": (
        "vllm:request_generation_tokens",
        "Number of generation tokens per request.",
        _TOKEN_BUCKETS,
    ),
}


@dataclass
class StatsDelta:
    """What happened since the last drain: counter increments, latest gauges, histogram samples."""

    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    gauges: dict[str, float] | None = None
    gauges_at: float = 0.0  # time.monotonic() when the gauges were recorded (system-wide on Linux)
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in HISTOGRAMS})

    def empty(self) -> bool:
        return self.gauges is None and not any(self.counters.values()) and not any(self.samples.values())


class StatsBuffer:
    """Thread-safe accumulator between vLLM's stat-logger callback and the one publisher thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delta = StatsDelta()
        self.changed = threading.Event()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        with self._lock:
            delta = self._delta
            if scheduler_stats is not None:
                delta.gauges = {
                    "running": float(scheduler_stats.num_running_reqs),
                    "waiting": float(scheduler_stats.num_waiting_reqs),
                    "kv_cache_usage": float(scheduler_stats.kv_cache_usage),
                }
                delta.gauges_at = time.monotonic()
            if iteration_stats is not None:
                delta.counters["prompt_tokens"] += iteration_stats.num_prompt_tokens
                delta.counters["generation_tokens"] += iteration_stats.num_generation_tokens
                delta.counters["preemptions"] += iteration_stats.num_preempted_reqs
                delta.samples["time_to_first_token"].extend(iteration_stats.time_to_first_tokens_iter)
                for finished in iteration_stats.finished_requests:
                    delta.counters["request_success"] += 1
                    delta.samples["e2e_request_latency"].append(finished.e2e_latency)
                    delta.samples["request_prompt_tokens"].append(finished.num_prompt_tokens)
                    delta.samples["request_generation_tokens"].append(finished.num_generation_tokens)
                    if finished.num_generation_tokens > 1:
                        delta.samples["time_per_output_token"].append(finished.mean_time_per_output_token)
        self.changed.set()

    def drain(self) -> StatsDelta:
        with self._lock:
            delta, self._delta = self._delta, StatsDelta()
            self.changed.clear()
        return delta


class GaugeClock:
    """Newest-wins for gauges that several processes publish into one Triton metric.

    With several front ends of one engine (core/front_ends.py), vLLM hands each step's scheduler statistics to one
    of them (running, waiting, KV-cache usage: the engine's, not the front end's), and Triton shares a metric of
    the same name and labels between the core's instances. Each front end publishes on its own clock, so an older
    value could land after a newer one and stay (e.g. "running: 3" while idle). Each publisher sets the gauges only
    under this file's lock and only when its values are newer than the last ones set (vLLM's own multi-process
    gauges keep the most recent value, too). Counters and histograms add up and need none of this.
    """

    _STAMP = struct.Struct("d")

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch(exist_ok=True)

    @contextlib.contextmanager
    def newest(self, at: float) -> Iterator[bool]:
        """Yields whether `at` is newer than every gauge set so far (then it is the newest); the gauges must be set
        inside the block, which holds the lock."""
        with open(self.path, "r+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                raw = handle.read(self._STAMP.size)
                last = self._STAMP.unpack(raw)[0] if len(raw) == self._STAMP.size else float("-inf")
                newer = at > last
                if newer:
                    handle.seek(0)
                    handle.write(self._STAMP.pack(at))
                    handle.flush()
                yield newer
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


class StatsSink(Protocol):
    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None: ...


def stat_logger_factory(*sinks: StatsSink) -> Callable[..., Any]:
    """A vLLM StatLoggerBase class (vLLM instantiates it per engine) that feeds each sink (a StatsBuffer, the
    engine-step counters of core/step_stats.py)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SinkStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            for sink in sinks:
                sink.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return SinkStatLogger


def profiled_engine_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """The engine args with vLLM's statistics on, per-iteration details included (the EngineCore times each
    step's wait for the model's result), for the engine-step counters of core/step_stats.py. vLLM's own logging
    stat logger would log a line per iteration: `quiet_iteration_log` drops those."""
    quiet_iteration_log()
    return {**engine_args, "disable_log_stats": False, "enable_logging_iteration_details": True}


def _not_an_iteration_line(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and "Iteration(%d)" in record.msg)


def quiet_iteration_log() -> None:
    logger = logging.getLogger("vllm.v1.metrics.loggers")
    if _not_an_iteration_line not in logger.filters:
        logger.addFilter(_not_an_iteration_line)
