"""core.engine cancellation against the real vLLM engine, in-process (no Triton): the probe, cancel by key, an
abort that overtakes its request. A cancelled request ends with one final Unavailable, and vLLM runs nothing."""

from __future__ import annotations

import json
import threading
import time

import pytest

from core.engine import CANCEL_POLL_SECONDS, Engine
from core.interface import Unavailable
from core.protocol import EngineRequest
from tests.conftest import REPOSITORY
from tools.triton_server import private_tmp_dir

LONG = {"temperature": 0, "max_tokens": 480, "ignore_eos": True}

pytestmark = pytest.mark.server  # a real vLLM engine, in this process


@pytest.fixture(scope="module")
def engine(tiny_model):
    args = json.loads((REPOSITORY / "vllm_core" / "1" / "model.json").read_text())
    args["model"] = str(tiny_model)
    with private_tmp_dir("vllm-test-"):  # vLLM leaves its socket files in TMPDIR
        instance = Engine(args)
        instance.start()
        yield instance
        instance.shutdown()


class Collector:
    def __init__(self) -> None:
        self.calls: list[tuple[object, object, bool]] = []
        self.done = threading.Event()

    def __call__(self, response, error, final) -> None:
        self.calls.append((response, error, final))
        if final:
            self.done.set()


def _request() -> EngineRequest:
    return EngineRequest(sampling=dict(LONG), prompt_token_ids=[1, 2, 3, 4], stream=True)


def _running(engine: Engine) -> int:
    return engine._llm.output_processor.get_num_unfinished_requests()


def test_probe_turning_true_aborts_within_a_poll(engine, monkeypatch):
    # The tiny model makes LONG's 480 tokens on a fast CPU in about the default poll (0.5 s): the request could end on
    # its own before the probe was read (seen once in CI). Poll 10x as often, and wait out the watcher's current wait.
    monkeypatch.setattr("core.engine.CANCEL_POLL_SECONDS", 0.05)
    time.sleep(CANCEL_POLL_SECONDS + 0.1)
    cancelled = threading.Event()
    out = Collector()
    engine.submit(_request(), out, cancelled.is_set)
    while not out.calls:
        time.sleep(0.01)
    start = time.monotonic()
    cancelled.set()
    assert out.done.wait(10)
    elapsed = time.monotonic() - start
    assert elapsed < 3, elapsed
    assert isinstance(out.calls[-1][1], Unavailable)
    assert [final for *_, final in out.calls].count(True) == 1
    assert _running(engine) == 0


def test_cancel_by_key_and_an_abort_that_comes_first(engine):
    out = Collector()
    engine.submit(_request(), out, lambda: False, key="k1")
    while not out.calls:
        time.sleep(0.01)
    assert engine.cancel_key("k1")
    assert out.done.wait(10) and isinstance(out.calls[-1][1], Unavailable)

    assert not engine.cancel_key("k2")  # not submitted yet: remembered
    early = Collector()
    engine.submit(_request(), early, lambda: False, key="k2")
    assert early.done.wait(10)
    assert len(early.calls) == 1 and isinstance(early.calls[0][1], Unavailable)
    assert _running(engine) == 0


def test_a_request_that_finishes_is_not_aborted_afterwards(engine, monkeypatch):
    """vLLM's generator of a finished request runs to its end: one left suspended at its last output would be closed
    by the event loop's async-generator finalizer, which runs vLLM's abort path for every request (a task and a
    self-pipe write each, on the loop that takes the next requests in)."""
    aborted: list[object] = []
    original = engine._llm.abort

    async def counting_abort(request_id, *args, **kwargs):
        aborted.append(request_id)
        return await original(request_id, *args, **kwargs)

    monkeypatch.setattr(engine._llm, "abort", counting_abort)
    short = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    collectors = []
    for stream in (False, True, False):
        out = Collector()
        engine.submit(EngineRequest(sampling=dict(short), prompt_token_ids=[1, 2, 3], stream=stream), out, None)
        collectors.append(out)
    for out in collectors:
        assert out.done.wait(30)
        assert out.calls[-1][1] is None and out.calls[-1][2]  # a final response, no error
    time.sleep(0.5)  # a finalizer's aclose task would have run by now
    assert aborted == []
    assert _running(engine) == 0
