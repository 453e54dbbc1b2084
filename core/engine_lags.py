"""How long requests and outputs take between the code that drives vLLM and vLLM's EngineCore, by the engine's clock.

vLLM's per-request statistics (`RequestOutput.metrics`, only with `disable_log_stats: false`) carry the
EngineCore's own timestamps: when it queued the request (`queued_ts`) and when the step that made the output's
last token ended (`last_token_ts`). Both are `time.monotonic()` in the EngineCore's process; on Linux that clock is
the system's, so they compare with the consumer's own. `EngineLags` adds up, between snapshots:

- intake: from the moment the request was handed over (the core's `execute`, the bare client's call) until the
  EngineCore queued it: the front end's input handling and the trip to the EngineCore; of it, the hand-over: until
  vLLM's front end took the request's inputs in (its `arrival_time`, by the wall clock: converted here), the time
  the request waited for the front end's event loop;
- return: from the end of the step that made an output until its consumer has it: the trip back, vLLM's output
  handling for the whole step, and the wait for the consumer's coroutine to run;
- and, from each finished request's timestamps, its time inside the EngineCore: queue (queued until first
  scheduled), prefill (scheduled until the step that made its first token ended) and the mean time per token after
  the first (until the step that made its last token ended).

Side by side with the bare engine they say how much of a served request's time outside the engine is the front
end's own (the core's one interpreter runs it with everything else). `tools/bench.py --profile` turns them on for
the bare engine and the core alike. Triton-free and vLLM-free (the statistics are read by attribute).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from core.averages import mean, weighted_mean


@dataclass(frozen=True)
class LagSnapshot:
    requests: int  # requests whose intake was measured (their first output)
    intake_ms: float  # mean
    outputs: int
    return_ms: float  # mean
    finished: int = 0  # finished requests with every timestamp, and their means inside the EngineCore:
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    token_ms: float = 0.0  # per token after the first
    handed: int = 0  # requests whose hand-over was measured (vLLM's arrival_time known), and its mean
    handover_ms: float = 0.0

    def describe(self) -> str:
        """One log line; `parse_line` reads it back."""
        return (
            f"engine lags: intake {self.intake_ms:.2f} ms mean over {self.requests} requests,"
            f" return {self.return_ms:.2f} ms mean over {self.outputs} outputs;"
            f" inside: queue {self.queue_ms:.2f} ms, prefill {self.prefill_ms:.2f} ms,"
            f" {self.token_ms:.3f} ms per token, means over {self.finished} finished requests;"
            f" hand-over {self.handover_ms:.2f} ms mean over {self.handed} requests"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_LINE = re.compile(
    r"engine lags: intake (?P<intake_ms>-?[\d.]+) ms mean over (?P<requests>\d+) requests,"
    r" return (?P<return_ms>-?[\d.]+) ms mean over (?P<outputs>\d+) outputs;"
    r" inside: queue (?P<queue_ms>-?[\d.]+) ms, prefill (?P<prefill_ms>-?[\d.]+) ms,"
    r" (?P<token_ms>-?[\d.]+) ms per token, means over (?P<finished>\d+) finished requests"
    r"(?:; hand-over (?P<handover_ms>-?[\d.]+) ms mean over (?P<handed>\d+) requests)?"  # absent from older lines
)


def parse_line(line: str) -> LagSnapshot | None:
    match = _LINE.search(line)
    if match is None:
        return None
    fields = match.groupdict()
    return LagSnapshot(
        requests=int(fields["requests"]),
        intake_ms=float(fields["intake_ms"]),
        outputs=int(fields["outputs"]),
        return_ms=float(fields["return_ms"]),
        finished=int(fields["finished"]),
        queue_ms=float(fields["queue_ms"]),
        prefill_ms=float(fields["prefill_ms"]),
        token_ms=float(fields["token_ms"]),
        handed=int(fields["handed"] or 0),
        handover_ms=float(fields["handover_ms"] or 0.0),
    )


def combine(snapshots: list[LagSnapshot]) -> LagSnapshot | None:
    """Several intervals as one (means weighted by their counts); None when none counted anything."""
    requests = sum(snap.requests for snap in snapshots)
    outputs = sum(snap.outputs for snap in snapshots)
    finished = sum(snap.finished for snap in snapshots)
    if not requests and not outputs:
        return None

    def weighted(name: str, count: str) -> float:
        return weighted_mean((getattr(snap, name), getattr(snap, count)) for snap in snapshots)

    return LagSnapshot(
        requests=requests,
        intake_ms=weighted("intake_ms", "requests"),
        outputs=outputs,
        return_ms=weighted("return_ms", "outputs"),
        finished=finished,
        queue_ms=weighted("queue_ms", "finished"),
        prefill_ms=weighted("prefill_ms", "finished"),
        token_ms=weighted("token_ms", "finished"),
        handed=sum(snap.handed for snap in snapshots),
        handover_ms=weighted("handover_ms", "handed"),
    )


@dataclass
class _Totals:
    """What EngineLags adds up between two snapshots (seconds)."""

    requests: int = 0
    intake: float = 0.0
    outputs: int = 0
    back: float = 0.0
    finished: int = 0
    queue: float = 0.0
    prefill: float = 0.0
    per_token: float = 0.0
    handed: int = 0
    handover: float = 0.0


class EngineLags:
    """Thread-safe; `output` is called by whoever consumes vLLM's outputs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = _Totals()

    def output(self, metrics: Any, submitted: float, first: bool, finished: bool = False) -> None:
        """An output of a request handed to the engine at `submitted` (time.monotonic()) has just arrived;
        `finished`: it is the request's last."""
        if metrics is None:  # vLLM's statistics are off
            return
        now = time.monotonic()
        last_token = getattr(metrics, "last_token_ts", 0.0) or 0.0
        queued = getattr(metrics, "queued_ts", 0.0) or 0.0
        scheduled = getattr(metrics, "scheduled_ts", 0.0) or 0.0
        first_token = getattr(metrics, "first_token_ts", 0.0) or 0.0
        tokens = getattr(metrics, "num_generation_tokens", 0) or 0
        # vLLM's front end stamps arrival by the wall clock: on this process's monotonic clock (first outputs only)
        arrival = (getattr(metrics, "arrival_time", 0.0) or 0.0) if first else 0.0
        arrived = arrival - (time.time() - now) if arrival > 0 else 0.0
        with self._lock:
            totals = self._totals
            if last_token > 0:
                totals.outputs += 1
                totals.back += now - last_token
            if first and queued > 0:
                totals.requests += 1
                totals.intake += queued - submitted
            if arrived > 0:
                totals.handed += 1
                totals.handover += arrived - submitted
            if finished and tokens > 1 and 0 < queued <= scheduled <= first_token <= last_token:
                totals.finished += 1
                totals.queue += scheduled - queued
                totals.prefill += first_token - scheduled
                totals.per_token += (last_token - first_token) / (tokens - 1)

    def snapshot(self) -> LagSnapshot:
        """The figures since the last snapshot (and start again)."""
        with self._lock:
            totals, self._totals = self._totals, _Totals()
        return LagSnapshot(
            requests=totals.requests,
            intake_ms=1000 * mean(totals.intake, totals.requests),
            outputs=totals.outputs,
            return_ms=1000 * mean(totals.back, totals.outputs),
            finished=totals.finished,
            queue_ms=1000 * mean(totals.queue, totals.finished),
            prefill_ms=1000 * mean(totals.prefill, totals.finished),
            token_ms=1000 * mean(totals.per_token, totals.finished),
            handed=totals.handed,
            handover_ms=1000 * mean(totals.handover, totals.handed),
        )
