"""The core's sender (core/adapters/core_model.py) with core.postprocess_in_sender, outside Triton: what it sends
a BLS caller, what it sends the streaming ensemble, and how a failing postprocess stage ends one request."""

from __future__ import annotations

import pytest

from core.coalesce import Outgoing
from core.protocol import EngineResponse, SequenceDelta, decode_response
from tests.support.fake_triton import FINAL_FLAG, RecordingSender


def _response(text: str, finished: bool = False) -> EngineResponse:
    seq = SequenceDelta(index=0, text=text, token_ids=[5], finish_reason="length" if finished else None)
    return EngineResponse(outputs=[seq], num_input_tokens=3, finished=finished, streamed=True)


@pytest.fixture
def core(rendered_core):
    model, _ = rendered_core("{postprocess_in_sender: true}")
    return model


def test_a_bls_caller_gets_the_engine_response_and_the_ensemble_the_stage_outputs(core):
    model = core
    from core.adapters.core_model import CoreSender

    raw, staged = CoreSender(RecordingSender()), CoreSender(RecordingSender())
    staged.stage_parameters = {}
    for sender in (raw, staged):
        model._send(Outgoing(sender, _response("Hello"), None, False))
        model._send(Outgoing(sender, _response(" world", finished=True), None, True))
    (first, flags), (last, last_flags) = raw._sender.sent
    assert (flags, last_flags) == (0, FINAL_FLAG)
    assert decode_response(first.output_tensors["engine_response"].reshape(-1)[0]).outputs[0].text == "Hello"
    (first, flags), (last, last_flags) = staged._sender.sent
    assert (flags, last_flags) == (0, FINAL_FLAG) and "engine_response" not in first.output_tensors
    assert first.output_tensors["text_output"].tolist() == [b"Hello"]
    assert last.output_tensors["text_output"].tolist() == [b" world"]


def test_a_failing_stage_ends_its_request_with_the_error_and_aborts_its_generation(core, monkeypatch):
    model = core
    from core.adapters.core_model import CoreSender
    from core.interface import InvalidInput

    sender = CoreSender(RecordingSender())
    sender.stage_parameters, sender.engine_request_id = {}, "triton-7"
    model._send(Outgoing(sender, _response("Hello"), None, False))

    def fail(inputs, parameters):
        raise InvalidInput("text_output: cannot encode")

    monkeypatch.setattr(model.postprocess.stage, "process", fail)
    model._send(Outgoing(sender, _response(" world"), None, False))
    model._send(Outgoing(sender, _response("!", finished=True), None, True))  # after the error: dropped
    sent = sender._sender.sent
    assert len(sent) == 2 and sent[0][0].output_tensors["text_output"].tolist() == [b"Hello"]
    error, flags = sent[1]
    assert flags == FINAL_FLAG and error.error.code == "INVALID_ARG" and "cannot encode" in error.error.message
    assert model.engine.cancelled == ["triton-7"]
