"""Per-step figures of the vLLM engine, from its own statistics: is the engine's batch full, and how fast it steps.

vLLM hands every stat logger the scheduler's state after each engine step (`record()`, on the front end's output
handler; only with `disable_log_stats: false`). `EngineSteps` adds them up between snapshots: steps per second,
the mean number of requests running in a step (the batch) and waiting for one, and tokens per second. Side by
side with the bare engine at the same load, they say where a served path loses throughput: a smaller batch means
requests spend their time outside the engine (the serving path); the same batch at fewer steps per second means
each step got slower. With vLLM's iteration details on (`enable_logging_iteration_details`, see
`profiled_engine_args` in core/metrics.py) they also tell a slower step's cause apart: how many steps computed
prompt tokens (requests arriving spread out make more of them), the decode-only steps' rate alone, and how long
the EngineCore waited for the model's result per step (the rest of a step is its own CPU work).
`tools/bench.py --profile` turns them on for the bare engine and the core alike.

With several front ends of one engine (core/front_ends.py) vLLM hands each step's scheduler statistics to one of
them, and each front end sees only its own requests' tokens: every front end counts *untimed* (no gaps between
steps, which would span steps handed to the others), and their counts add up to the engine's (steps, prompt
steps, the batch, tokens); steps per second stay unknown.
Triton-free and vLLM-free (the statistics are read by attribute), so unit tests reach it.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from core.averages import mean, weighted_mean


@dataclass(frozen=True)
class StepSnapshot:
    seconds: float
    busy_seconds: float  # the time from each step with requests running to the next: the engine's steps' time
    steps: int
    running_mean: float
    running_max: int
    waiting_mean: float
    generation_tokens: int
    prompt_tokens: int
    # From vLLM's iteration details (0 without them): the steps that had details, those that computed prompt
    # tokens, the busy time before each decode-only step, and the mean wait for the model's result per step.
    detailed_steps: int = 0
    prefill_steps: int = 0
    decode_busy_seconds: float = 0.0
    decode_wait_ms: float = 0.0
    prefill_wait_ms: float = 0.0
    # Prompt tokens the model computed (the iteration details' context tokens: 0 without them) and the prefix cache's
    # lookups: of the prompt tokens queried, how many it already held. Two engines given the same prompts should
    # compute about as many; one that computed more did more work per step.
    computed_prompt_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    timed: bool = True  # False: one of several front ends' share of the steps, without their time (see above)

    @property
    def steps_per_second(self) -> float | None:
        if not self.timed:
            return None
        return self.steps / self.busy_seconds if self.busy_seconds > 0 else 0.0

    @property
    def counted(self) -> bool:
        """Anything to log: steps, or tokens (one of several front ends may see its requests' tokens in an interval
        whose steps' statistics all went to the others)."""
        return bool(self.steps or self.generation_tokens or self.prompt_tokens)

    @property
    def decode_steps(self) -> int:
        return self.detailed_steps - self.prefill_steps

    @property
    def decode_steps_per_second(self) -> float | None:
        if not self.timed:
            return None
        return self.decode_steps / self.decode_busy_seconds if self.decode_busy_seconds > 0 else 0.0

    def describe(self) -> str:
        """One log line; `parse_line` reads it back."""
        busy = f"{self.busy_seconds:.3f} s busy" if self.timed else "untimed"
        return (
            f"engine steps: {self.steps} in {self.seconds:.2f} s ({busy}),"
            f" running mean {self.running_mean:.1f}"
            f" max {self.running_max}, waiting mean {self.waiting_mean:.1f},"
            f" tokens {self.generation_tokens} generated {self.prompt_tokens} prompt;"
            f" detailed {self.detailed_steps} prefill {self.prefill_steps},"
            f" decode busy {self.decode_busy_seconds:.3f} s, wait ms decode {self.decode_wait_ms:.2f}"
            f" prefill {self.prefill_wait_ms:.2f}; prompt computed {self.computed_prompt_tokens}"
            f" cache hits {self.cache_hits} of {self.cache_queries}"
        )

    def as_dict(self) -> dict[str, Any]:
        rate, decode_rate = self.steps_per_second, self.decode_steps_per_second
        return {
            **asdict(self),
            "steps_per_second": None if rate is None else round(rate, 1),
            "decode_steps_per_second": None if decode_rate is None else round(decode_rate, 1),
        }


_LINE = re.compile(
    r"engine steps: (?P<steps>\d+) in (?P<seconds>[\d.]+) s"
    r" \((?:(?P<busy_seconds>[\d.]+) s busy|(?P<untimed>untimed))\),"
    r" running mean (?P<running_mean>[\d.]+)"
    r" max (?P<running_max>\d+), waiting mean (?P<waiting_mean>[\d.]+),"
    r" tokens (?P<generation_tokens>\d+) generated (?P<prompt_tokens>\d+) prompt"
    r"(?:; detailed (?P<detailed_steps>\d+) prefill (?P<prefill_steps>\d+),"
    r" decode busy (?P<decode_busy_seconds>[\d.]+) s, wait ms decode (?P<decode_wait_ms>[\d.]+)"
    r" prefill (?P<prefill_wait_ms>[\d.]+))?"
    r"(?:; prompt computed (?P<computed_prompt_tokens>\d+) cache hits (?P<cache_hits>\d+) of (?P<cache_queries>\d+))?"
)
_INTS = {
    "steps", "running_max", "generation_tokens", "prompt_tokens", "detailed_steps", "prefill_steps",
    "computed_prompt_tokens", "cache_queries", "cache_hits",
}  # fmt: skip


def parse_line(line: str) -> StepSnapshot | None:
    match = _LINE.search(line)
    if match is None:
        return None
    found = {key: value for key, value in match.groupdict().items() if value}
    untimed = found.pop("untimed", None) is not None
    fields: dict[str, Any] = {key: (int if key in _INTS else float)(value) for key, value in found.items()}
    fields.setdefault("busy_seconds", 0.0)  # an untimed line has none
    return StepSnapshot(**fields, timed=not untimed)


def combine(snapshots: list[StepSnapshot]) -> StepSnapshot | None:
    """Several intervals as one (means weighted by steps; tokens from every interval, those of one front end without
    steps too); None for none with a step."""
    busy = [snap for snap in snapshots if snap.steps]
    if not busy:
        return None
    steps = sum(snap.steps for snap in busy)
    prefill_steps = sum(snap.prefill_steps for snap in busy)
    return StepSnapshot(
        seconds=sum(snap.seconds for snap in busy),
        busy_seconds=sum(snap.busy_seconds for snap in busy),
        steps=steps,
        running_mean=weighted_mean((snap.running_mean, snap.steps) for snap in busy),
        running_max=max(snap.running_max for snap in busy),
        waiting_mean=weighted_mean((snap.waiting_mean, snap.steps) for snap in busy),
        generation_tokens=sum(snap.generation_tokens for snap in snapshots),
        prompt_tokens=sum(snap.prompt_tokens for snap in snapshots),
        detailed_steps=sum(snap.detailed_steps for snap in busy),
        prefill_steps=prefill_steps,
        decode_busy_seconds=sum(snap.decode_busy_seconds for snap in busy),
        decode_wait_ms=weighted_mean((snap.decode_wait_ms, snap.decode_steps) for snap in busy),
        prefill_wait_ms=weighted_mean((snap.prefill_wait_ms, snap.prefill_steps) for snap in busy),
        computed_prompt_tokens=sum(snap.computed_prompt_tokens for snap in busy),
        cache_queries=sum(snap.cache_queries for snap in busy),
        cache_hits=sum(snap.cache_hits for snap in busy),
        timed=all(snap.timed for snap in snapshots),
    )


@dataclass
class _Totals:
    """What EngineSteps adds up between two snapshots."""

    steps: int = 0
    busy: float = 0.0
    running: int = 0
    running_max: int = 0
    waiting: int = 0
    generation: int = 0
    prompt: int = 0
    detailed: int = 0
    prefill: int = 0
    decode_busy: float = 0.0
    decode_wait: float = 0.0
    prefill_wait: float = 0.0
    computed_prompt: int = 0
    cache_queries: int = 0
    cache_hits: int = 0


class EngineSteps:
    """A stat-logger sink (see core/metrics.py's stat_logger_factory); thread-safe. `timed=False` for one of several
    front ends: it counts the steps handed to it and never times them."""

    def __init__(self, timed: bool = True) -> None:
        self.timed = timed
        self._lock = threading.Lock()
        self._since = time.perf_counter()
        self._last: tuple[float, int] | None = None  # the previous step: when, and how many were running
        self._totals = _Totals()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        with self._lock:
            totals = self._totals
            if scheduler_stats is not None:
                now = time.perf_counter()
                timed = self.timed and self._last is not None and self._last[1] > 0
                took = now - self._last[0] if timed else 0.0
                totals.busy += took
                self._last = (now, scheduler_stats.num_running_reqs)
                details = getattr(scheduler_stats, "iteration_details", None)
                if details is not None and not details.is_dummy:
                    totals.detailed += 1
                    totals.computed_prompt += details.num_ctx_tokens
                    if details.num_ctx_tokens > 0:
                        totals.prefill += 1
                        totals.prefill_wait += details.elapsed_ms
                    else:
                        totals.decode_busy += took
                        totals.decode_wait += details.elapsed_ms
                totals.steps += 1
                totals.running += scheduler_stats.num_running_reqs
                totals.running_max = max(totals.running_max, scheduler_stats.num_running_reqs)
                totals.waiting += scheduler_stats.num_waiting_reqs
                cache = getattr(scheduler_stats, "prefix_cache_stats", None)
                if cache is not None:
                    totals.cache_queries += cache.queries
                    totals.cache_hits += cache.hits
            if iteration_stats is not None:
                totals.generation += iteration_stats.num_generation_tokens
                totals.prompt += iteration_stats.num_prompt_tokens

    def snapshot(self) -> StepSnapshot:
        """The figures since the last snapshot (and start again)."""
        now = time.perf_counter()
        with self._lock:
            totals, self._totals = self._totals, _Totals()
            since, self._since = self._since, now
        return StepSnapshot(
            seconds=now - since,
            busy_seconds=totals.busy,
            steps=totals.steps,
            running_mean=mean(totals.running, totals.steps),
            running_max=totals.running_max,
            waiting_mean=mean(totals.waiting, totals.steps),
            generation_tokens=totals.generation,
            prompt_tokens=totals.prompt,
            detailed_steps=totals.detailed,
            prefill_steps=totals.prefill,
            decode_busy_seconds=totals.decode_busy,
            decode_wait_ms=mean(totals.decode_wait, totals.detailed - totals.prefill),
            prefill_wait_ms=mean(totals.prefill_wait, totals.prefill),
            computed_prompt_tokens=totals.computed_prompt,
            cache_queries=totals.cache_queries,
            cache_hits=totals.cache_hits,
            timed=self.timed,
        )
