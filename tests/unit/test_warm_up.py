"""core/warm_up.py without vLLM: the warm-up request's shape and outcome, and the stat sink that tells when its
statistics have arrived."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from core.protocol import EngineResponse, SequenceDelta
from core.warm_up import WARM_UP_PROMPT, FinishWatch, warm_up


class FakeEngine:
    """Answers each submitted request from another thread, as the core's engine loop does."""

    def __init__(self, answers: list[tuple[EngineResponse | None, Exception | None, bool]]) -> None:
        self.answers = answers
        self.requests = []

    def submit(self, request, emit, is_cancelled, key=""):
        self.requests.append(request)
        threading.Thread(target=lambda: [emit(*answer) for answer in self.answers]).start()
        return "triton-0"


def _response(finished: bool) -> EngineResponse:
    delta = SequenceDelta(index=0, text="", token_ids=[7])
    return EngineResponse(outputs=[delta], num_input_tokens=4, finished=finished)


def test_warm_up_sends_a_short_token_id_request_and_returns_its_responses():
    engine = FakeEngine([(_response(False), None, False), (_response(True), None, True)])
    responses, problem = warm_up(engine, stream=True)
    assert problem is None
    assert [r.finished for r in responses] == [False, True]
    (request,) = engine.requests
    assert request.prompt_token_ids == list(WARM_UP_PROMPT) and request.stream
    assert request.sampling["max_tokens"] == 2 and request.sampling["temperature"] == 0.0


def test_warm_up_reports_an_error_and_a_request_that_never_ends():
    _, problem = warm_up(FakeEngine([(None, RuntimeError("engine dead"), True)]), stream=False)
    assert problem == "failed: engine dead"
    _, problem = warm_up(FakeEngine([(_response(False), None, False)]), stream=False, timeout=0.2)
    assert problem == "did not end within 0.2 s"


def test_finish_watch_waits_for_finished_requests_in_the_statistics():
    watch = FinishWatch()
    assert not watch.wait_finished(1, 0.01)
    watch.record(SimpleNamespace(num_running_reqs=1), None)  # scheduler statistics alone finish nothing
    watch.record(None, SimpleNamespace(finished_requests=[]))
    assert not watch.wait_finished(1, 0.01)
    later = threading.Timer(0.05, watch.record, args=(None, SimpleNamespace(finished_requests=[object()])))
    later.start()
    assert watch.wait_finished(1, 5.0)
    later.join()
