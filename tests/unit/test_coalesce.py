"""The core's coalescing of queued responses (core/coalesce.py): order, FINAL and errors kept, deltas merged."""

from __future__ import annotations

import pytest

from core.coalesce import Outgoing, coalesce
from core.protocol import EngineResponse, SequenceDelta


def _delta(request: str, ids: list[int], finished: bool = False, context: list[int] | None = None) -> EngineResponse:
    seq = SequenceDelta(0, "", list(ids), "length" if finished else None, context_ids=context or [])
    return EngineResponse([seq], num_input_tokens=3, finished=finished, request_id=request, streamed=True)


def test_an_idle_pipeline_sends_each_delta_as_it_is():
    a = object()
    items = [Outgoing(a, _delta("a", [1]), None, False)]
    assert coalesce(items) == items


def test_queued_deltas_of_one_request_go_out_as_one_streamed_delta_with_the_first_window():
    a = object()
    out = coalesce(
        [
            Outgoing(a, _delta("a", [1], context=[7, 8]), None, False),
            Outgoing(a, _delta("a", [2, 3], context=[1]), None, False),
            Outgoing(a, _delta("a", [4], finished=True, context=[3]), None, True),
        ]
    )
    assert len(out) == 1
    sender, response, error, final = out[0]
    assert (sender, error, final) == (a, None, True)
    assert response.streamed and response.finished and response.request_id == "a"
    assert response.outputs[0].token_ids == [1, 2, 3, 4]
    assert response.outputs[0].context_ids == [7, 8]  # the window before the first merged token
    assert response.outputs[0].finish_reason == "length"


def test_requests_are_merged_separately_and_keep_their_order():
    a, b = object(), object()
    out = coalesce(
        [
            Outgoing(a, _delta("a", [1]), None, False),
            Outgoing(b, _delta("b", [10]), None, False),
            Outgoing(a, _delta("a", [2]), None, False),
            Outgoing(b, _delta("b", [11], finished=True), None, True),
        ]
    )
    assert [(o.sender, o.response.outputs[0].token_ids, o.final) for o in out] == [
        (a, [1, 2], False),
        (b, [10, 11], True),
    ]


def test_an_error_is_never_merged_and_the_data_before_it_goes_first():
    a = object()
    failure = RuntimeError("engine died")
    out = coalesce(
        [
            Outgoing(a, _delta("a", [1]), None, False),
            Outgoing(a, _delta("a", [2]), None, False),
            Outgoing(a, None, failure, True),
        ]
    )
    assert [(o.response.outputs[0].token_ids if o.response else None, o.error, o.final) for o in out] == [
        ([1, 2], None, False),
        (None, failure, True),
    ]


def test_a_bare_final_stays_a_bare_final():
    a = object()
    assert coalesce([Outgoing(a, None, None, True)]) == [Outgoing(a, None, None, True)]


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_merged_deltas_carry_every_token_once(split):
    a = object()
    ids = list(range(11))
    chunks = [ids[i : i + split] for i in range(0, len(ids), split)]
    items = [
        Outgoing(a, _delta("a", c, finished=i == len(chunks) - 1), None, i == len(chunks) - 1)
        for i, c in enumerate(chunks)
    ]
    # the sender thread drains whatever is queued: any cut of the queue must give the same tokens in order
    for cut in range(1, len(items) + 1):
        out = coalesce(items[:cut]) + coalesce(items[cut:])
        assert [t for o in out for t in o.response.outputs[0].token_ids] == ids
        assert [o.final for o in out][-1] is True and sum(o.final for o in out) == 1


def test_the_pacer_sends_a_requests_first_delta_and_its_final_at_once_and_holds_the_rest():
    from core.coalesce import StreamPacer

    a = object()
    pacer = StreamPacer(interval=0.02)
    pacer.add(Outgoing(a, _delta("a", [1]), None, False))
    first = pacer.take_due(now=100.0)
    assert [o.response.outputs[0].token_ids for o in first] == [[1]]  # the first delta never waits
    pacer.add(Outgoing(a, _delta("a", [2]), None, False))
    pacer.add(Outgoing(a, _delta("a", [3]), None, False))
    assert pacer.take_due(now=100.01) == []  # within the interval: held
    assert pacer.wait_seconds(now=100.01) == pytest.approx(0.01)
    due = pacer.take_due(now=100.025)
    assert [(o.response.outputs[0].token_ids, o.final) for o in due] == [([2, 3], False)]
    pacer.add(Outgoing(a, _delta("a", [4]), None, False))
    pacer.add(Outgoing(a, _delta("a", [5], finished=True), None, True))
    final = pacer.take_due(now=100.026)  # the final never waits, and takes what was held with it
    assert [(o.response.outputs[0].token_ids, o.final) for o in final] == [([4, 5], True)]
    assert not pacer and pacer.wait_seconds(now=101.0) is None


def test_the_pacer_with_interval_zero_holds_nothing_and_errors_go_at_once():
    from core.coalesce import StreamPacer

    a, b = object(), object()
    pacer = StreamPacer(interval=0.0)
    pacer.add(Outgoing(a, _delta("a", [1]), None, False))
    assert len(pacer.take_due(now=1.0)) == 1
    pacer.add(Outgoing(a, _delta("a", [2]), None, False))
    assert len(pacer.take_due(now=1.0)) == 1
    slow = StreamPacer(interval=10.0)
    slow.add(Outgoing(b, _delta("b", [1]), None, False))
    slow.take_due(now=0.0)
    slow.add(Outgoing(b, _delta("b", [2]), None, False))
    failure = RuntimeError("engine died")
    slow.add(Outgoing(b, None, failure, True))
    out = slow.take_due(now=0.001)
    assert [(o.error, o.final) for o in out] == [(None, False), (failure, True)]
    slow.add(Outgoing(a, _delta("a", [9]), None, False))
    slow.add(Outgoing(a, _delta("a", [10]), None, False))
    assert len(slow.take_due(now=0.002)) == 1  # a's first delta(s): at once
    slow.add(Outgoing(a, _delta("a", [11]), None, False))
    assert slow.take_due(now=0.003) == [] and len(slow.take_due(now=0.003, everything=True)) == 1  # shutdown


def test_core_stats_count_requests_and_sends_per_snapshot():
    from core.core_stats import CoreStats

    class Log:
        def log_info(self, message: str) -> None:  # pragma: no cover - the thread logs only after its interval
            pass

    stats = CoreStats(Log(), interval=3600)
    stats.executed(3)
    stats.executed(1)
    for seconds in (0.001, 0.002, 0.003):
        stats.sent(seconds)
    snap = stats.snapshot()
    assert (snap["executes"], snap["requests"], snap["sends"]) == (2, 4, 3)
    assert snap["send_mean_ms"] == pytest.approx(2.0)
    assert stats.snapshot()["sends"] == 0  # counters restart after each snapshot
    stats.stop()


def test_core_stats_break_each_first_response_down_into_engine_queue_and_send():
    import time

    from core.core_stats import CoreStats

    class Log:
        def log_info(self, message: str) -> None:  # pragma: no cover - the thread logs only after its interval
            pass

    stats = CoreStats(Log(), interval=3600)
    start = time.perf_counter()
    stats.admitted("a")
    stats.admitted("b")  # refused before vLLM gave it anything: its final send is not a first-response record
    time.sleep(0.02)
    stats.emitted("a")
    first_output = time.perf_counter()
    time.sleep(0.01)
    stats.emitted("a")  # a later output of the same request changes nothing
    time.sleep(0.005)
    before_send_end = time.perf_counter()
    stats.sent(0.002, "a")
    stats.sent(0.001, "a")  # a's second response
    stats.sent(0.001, "b")
    snap = stats.snapshot()
    assert snap["sends"] == 3 and snap["firsts"] == 1
    assert 20 <= snap["first_engine_p50_ms"] <= 1000 * (first_output - start)
    assert snap["first_queued_p50_ms"] >= 1000 * (before_send_end - first_output) - 2
    assert snap["first_send_p50_ms"] == pytest.approx(2.0)
    stats.stop()


def test_core_stats_log_the_engines_steps_each_interval():
    import time
    from types import SimpleNamespace

    from core.core_stats import CoreStats
    from core.step_stats import EngineSteps, parse_line

    lines: list[str] = []

    class Log:
        def log_info(self, message: str) -> None:
            lines.append(message)

    steps = EngineSteps()
    stats = CoreStats(Log(), interval=0.05, steps=steps)
    for _ in range(3):
        steps.record(SimpleNamespace(num_running_reqs=8, num_waiting_reqs=0), None)
    deadline = time.monotonic() + 5
    while not any(parse_line(line) for line in lines) and time.monotonic() < deadline:
        time.sleep(0.01)
    stats.stop()
    logged = [snap for line in lines if (snap := parse_line(line)) is not None]
    assert logged and (logged[0].steps, logged[0].running_mean) == (3, 8.0)
    assert all(snap.steps for snap in logged)  # intervals without a step log no line
