"""The core's intake (core/adapters/core_model.py) with core.preprocess_threads, outside Triton: the streaming
ensemble's public inputs go through the preprocess stage on the core's own threads (several requests at once, execute
never waiting for them), a BLS caller's ENGINE_REQUEST goes to the engine as it is, and a request the stage refuses
ends with its error without reaching the engine."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from core.protocol import decode_request
from tests.support.fake_triton import FINAL_FLAG, Request


@pytest.fixture
def core(rendered_core):
    model, files = rendered_core("{preprocess_threads: 2, postprocess_in_sender: true}")
    return model, json.loads(files["preprocess/1/stage.json"])


def _public(text: str, sampling: dict) -> dict[str, np.ndarray]:
    return {
        "text_input": np.array([text.encode()], dtype=np.object_),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
        "stream": np.array([True]),
    }


def _sent(request: Request, count: int) -> list:
    """What the core's sender thread sent for the request, once it sent `count` responses (5 s at most)."""
    deadline = time.monotonic() + 5
    while len(request.sender.sent) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return request.sender.sent


def _submitted(model, count: int) -> list:
    """The requests the core handed to the engine, once it handed `count` (5 s at most: the preprocess threads')."""
    deadline = time.monotonic() + 5
    while len(model.engine.submitted) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return model.engine.submitted


def test_the_streaming_ensembles_request_is_preprocessed_in_the_core(core, tiny_model: Path):
    from transformers import AutoTokenizer

    model, _ = core
    # Before any client's request: the core's own warm-up, streamed as the streaming ensemble's (core/warm_up.py)
    assert [r.stream for r in model.engine.warm_ups] == [True]
    request = Request(_public("The quick brown fox", {"temperature": 0, "max_tokens": 7}), requested=("text_output",))
    model.execute([request])
    (submitted,) = _submitted(model, 1)
    assert submitted.prompt_token_ids == AutoTokenizer.from_pretrained(tiny_model).encode("The quick brown fox")
    assert submitted.sampling["max_tokens"] == 7 and submitted.stream is True
    assert request.sender.sent == []  # nothing sent before the engine answers


def test_a_bls_callers_engine_request_goes_to_the_engine_as_it_is(core, tiny_model: Path, monkeypatch):
    """generate and the entry models send ENGINE_REQUEST (from the preprocess model): the core's stage is not run."""
    model, spec = core
    from preprocess.default import Preprocessor

    document = Preprocessor(spec["settings"]).process(_public("Hello", {"max_tokens": 3}), {})["engine_request"]

    def fail(inputs, parameters):
        raise AssertionError("the core preprocessed a request that carries ENGINE_REQUEST")

    monkeypatch.setattr(model.preprocess.stage, "process", fail)
    model.execute([Request({"engine_request": document}, requested=("engine_response",))])
    (submitted,) = model.engine.submitted
    assert submitted == decode_request(document.reshape(-1)[0])


def test_a_refused_request_ends_with_its_error_and_never_reaches_the_engine(core):
    model, _ = core
    bad = Request(_public("Hello", {"temperature": -1}), requested=("text_output",))
    good = Request(_public("Hello", {"max_tokens": 2}), requested=("text_output",))
    model.execute([bad, good])
    ((error, flags),) = _sent(bad, 1)
    assert flags == FINAL_FLAG and error.error.code == "INVALID_ARG" and "temperature" in error.error.message
    assert [r.sampling["max_tokens"] for r in _submitted(model, 1)] == [2]  # the next request went on


def test_a_crashing_stage_is_an_internal_error_of_that_request(core, monkeypatch):
    model, _ = core

    def crash(inputs, parameters):
        raise KeyError("boom")

    monkeypatch.setattr(model.preprocess.stage, "process", crash)
    request = Request(_public("Hello", {}), requested=("text_output",))
    model.execute([request])
    ((error, flags),) = _sent(request, 1)
    assert flags == FINAL_FLAG and error.error.code == "INTERNAL" and "boom" in error.error.message
    assert model.engine.submitted == []


def test_requests_are_preprocessed_side_by_side_while_execute_returns_at_once(core, monkeypatch):
    """A burst is not tokenized one request after the other (the core's 2 threads here, as the preprocess model's
    instances would): each stage call below waits until the other one runs too, and execute does not wait for them."""
    model, _ = core
    both_running, released = threading.Barrier(2, timeout=5), threading.Event()
    process = model.preprocess.stage.process

    def meet_then_process(inputs, parameters):
        both_running.wait()  # a BrokenBarrierError (an INTERNAL error below) unless the two run at once
        released.wait(5)
        return process(inputs, parameters)

    monkeypatch.setattr(model.preprocess.stage, "process", meet_then_process)
    requests = [Request(_public(f"Hello {i}", {"max_tokens": i + 1}), requested=("text_output",)) for i in range(2)]
    start = time.monotonic()
    model.execute(requests)
    assert time.monotonic() - start < 1 and model.engine.submitted == []  # execute returned before either ended
    released.set()
    assert sorted(r.sampling["max_tokens"] for r in _submitted(model, 2)) == [1, 2]
    assert [request.sender.sent for request in requests] == [[], []]  # no error was sent
