"""A front end's first request, made by the core itself before Triton calls the model ready.

Measured (docs/performance-gpu.md): after a server starts, the first request each front end serves is slower than
the ones after it (on the H100 a first token of 36-67 ms against 13-24 at one stream; on a 2-core CPU a plain
request's median 24 ms against 16), something done once in that process's engine client. So each front end sends
one short request through its own engine client at start. vLLM's statistics of it are not the clients': the stat
sinks drop it once `FinishWatch`, the last sink, has seen it finish.
Triton-free, so unit tests reach it.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from core.protocol import EngineRequest, EngineResponse

# Token ids that every vocabulary has, and the fewest new tokens that still run a decode step after the prefill.
WARM_UP_PROMPT = (0, 1, 2, 3)
WARM_UP_SAMPLING = {"temperature": 0.0, "max_tokens": 2, "ignore_eos": True}
WARM_UP_SECONDS = 60.0  # a loaded CI machine starting several servers at once; past it the model loads cold
STATS_SECONDS = 5.0  # from the request's end until vLLM's statistics of it reached the sinks


class Submits(Protocol):
    def submit(self, request: EngineRequest, emit: Any, is_cancelled: Any, key: str = "") -> str | None: ...


class FinishWatch:
    """A stat sink (core/metrics.py) that counts the finished requests in vLLM's statistics. Added after the other
    sinks: vLLM's stat logger feeds them in order, so once it has seen a finish, the sinks before it have too."""

    def __init__(self) -> None:
        self._finished = 0
        self._changed = threading.Condition()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        finished = len(getattr(iteration_stats, "finished_requests", None) or ())
        if finished:
            with self._changed:
                self._finished += finished
                self._changed.notify_all()

    def wait_finished(self, count: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._finished >= count, timeout)


def warm_up(engine: Submits, stream: bool, timeout: float = WARM_UP_SECONDS) -> tuple[list[EngineResponse], str | None]:
    """One short request through `engine`, streamed or not: its responses, and what went wrong (None: nothing)."""
    responses: list[EngineResponse] = []
    errors: list[Exception] = []
    done = threading.Event()

    def emit(response: EngineResponse | None, error: Exception | None, final: bool) -> None:
        if response is not None:
            responses.append(response)
        if error is not None:
            errors.append(error)
        if final:
            done.set()

    request = EngineRequest(sampling=dict(WARM_UP_SAMPLING), prompt_token_ids=list(WARM_UP_PROMPT), stream=stream)
    engine.submit(request, emit, None)
    if not done.wait(timeout):
        return responses, f"did not end within {timeout:g} s"
    if errors:
        return responses, f"failed: {errors[0]}"
    return responses, None
