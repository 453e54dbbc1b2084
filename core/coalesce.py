"""Coalescing the core's queued responses: fewer, larger stream deltas when the pipeline behind the core lags.

Every streamed response costs the same fixed work downstream, whatever it carries: an IPC send from the core's
stub, the ensemble scheduling the postprocess step, a postprocess execution, a gRPC/SSE message and the client's
own parsing (measured with the tiny model at concurrency 64: ~0.7 ms of CPU per response across the processes,
~64 responses per request). The core sends from one thread; when that thread falls behind the engine, the deltas
of one request that wait in its queue are merged into one (vLLM's own DELTA collector does the same for a slow
consumer). Nothing waits on purpose: an idle pipeline sends each delta at once, so time to first token is unchanged.
Triton-free, so unit tests reach it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from core.protocol import EngineResponse, merge_responses


class Outgoing(NamedTuple):
    """One queued response of a request: data (`response`) or a final `error`; `final` ends the request."""

    sender: Any
    response: EngineResponse | None
    error: BaseException | None
    final: bool


def _merged(pending: list[EngineResponse]) -> EngineResponse:
    return pending[0] if len(pending) == 1 else merge_responses(pending, streamed=pending[-1].streamed)


def coalesce(items: list[Outgoing]) -> list[Outgoing]:
    """Merge each sender's consecutive data responses, keeping each sender's order (and their first-seen order).

    An error is never merged: the data before it goes first, then the error (always final). The FINAL flag stays
    on the response that carries the request's last data, so the last data travels with FINAL
    (docs/platform-notes.md T8).
    """
    runs: dict[int, list[Outgoing]] = {}
    for item in items:
        runs.setdefault(id(item.sender), []).append(item)
    out: list[Outgoing] = []
    for run in runs.values():
        sender = run[0].sender
        pending: list[EngineResponse] = []
        for item in run:
            if item.error is not None:
                if pending:
                    out.append(Outgoing(sender, _merged(pending), None, False))
                    pending = []
                out.append(Outgoing(sender, None, item.error, True))
                continue
            if item.response is not None:
                pending.append(item.response)
            if item.final:
                out.append(Outgoing(sender, _merged(pending) if pending else None, None, True))
                pending = []
        if pending:
            out.append(Outgoing(sender, _merged(pending), None, False))
    return out


class StreamPacer:
    """Holds each request's queued responses until they are due, then hands them out merged.

    A request's responses are due when one of them is final (or an error), or when `interval` seconds have
    passed since its previous send; the first response of a request is due at once. interval 0: always due.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._pending: dict[int, list[Outgoing]] = {}  # id(sender) -> its responses not sent yet, in order
        self._last_sent: dict[int, float] = {}  # id(sender) -> when its previous response went (live requests)

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, item: Outgoing) -> None:
        self._pending.setdefault(id(item.sender), []).append(item)

    def wait_seconds(self, now: float) -> float | None:
        """How long until the next held response is due (None: nothing is held)."""
        if not self._pending:
            return None
        return max(0.0, min(self._last_sent.get(key, -self.interval) + self.interval for key in self._pending) - now)

    def take_due(self, now: float, everything: bool = False) -> list[Outgoing]:
        out: list[Outgoing] = []
        for key in list(self._pending):
            items = self._pending[key]
            last = self._last_sent.get(key, -self.interval)
            if not (everything or items[-1].final or now - last >= self.interval):
                continue
            del self._pending[key]
            out.extend(coalesce(items))
            if items[-1].final:
                self._last_sent.pop(key, None)
            else:
                self._last_sent[key] = now
        return out
