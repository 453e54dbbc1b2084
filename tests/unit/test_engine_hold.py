"""core/engine_hold.py: a step's outputs held in the EngineCore until the client needs them, with vLLM's own structs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs  # noqa: E402

from core.engine_hold import CLEANUP_MESSAGES, OutputHolder, hold_interval, known_fields  # noqa: E402


def request(kind: RequestOutputKind = RequestOutputKind.FINAL_ONLY, **params: object) -> SimpleNamespace:
    return SimpleNamespace(sampling_params=SamplingParams(output_kind=kind, **params), pooling_params=None)


def out(request_id: str, *ids: int, finish: str | None = None, **fields: object) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=request_id, new_token_ids=list(ids), finish_reason=finish, **fields)


def step(holder: OutputHolder, per_client: dict[int, list[EngineCoreOutput]]) -> dict[int, list[tuple]]:
    """The step through the holder: what each client is sent, as (request id, token ids, finish reason)."""
    sent = holder.filter({client: EngineCoreOutputs(outputs=outputs) for client, outputs in per_client.items()})
    return {
        client: [(o.request_id, o.new_token_ids, o.finish_reason) for o in message.outputs]
        for client, message in sent.items()
    }


def test_this_vllm_has_only_known_fields():
    assert known_fields(EngineCoreOutput, EngineCoreOutputs)


def test_hold_interval_by_what_the_request_reads():
    assert hold_interval(request(), 1) == math.inf
    assert hold_interval(request(RequestOutputKind.DELTA), 8) == 8
    assert hold_interval(request(RequestOutputKind.CUMULATIVE), 8) == 8
    assert hold_interval(request(RequestOutputKind.DELTA), 1) is None  # every token is read
    assert hold_interval(request(logprobs=1), 8) is None
    assert hold_interval(request(prompt_logprobs=1), 8) is None
    assert hold_interval(request(stop=["\n"]), 8) is None  # vLLM's front end looks for stop strings each token
    assert hold_interval(request(stop_token_ids=[7]), 8) == math.inf  # the engine stops on ids itself
    pooling = SimpleNamespace(sampling_params=None, pooling_params=object())
    assert hold_interval(pooling, 8) is None


def test_final_only_sends_the_first_token_then_everything_at_the_end():
    holder = OutputHolder({"a": request()}.get, stream_interval=8)
    assert step(holder, {0: [out("a", 1)]}) == {0: [("a", [1], None)]}
    assert step(holder, {0: [out("a", 2)]}) == {}  # the client gets no message at all
    assert step(holder, {0: [out("a", 3)]}) == {}
    assert step(holder, {0: [out("a", 4, finish="length")]}) == {0: [("a", [2, 3, 4], "length")]}
    assert (len(holder), holder.held) == (0, 2)


def test_streamed_requests_go_every_stream_interval_tokens():
    holder = OutputHolder({"s": request(RequestOutputKind.DELTA)}.get, stream_interval=3)
    sent = [step(holder, {1: [out("s", i)]}) for i in range(1, 9)]
    assert sent == [
        {1: [("s", [1], None)]},
        {},
        {},
        {1: [("s", [2, 3, 4], None)]},
        {},
        {},
        {1: [("s", [5, 6, 7], None)]},
        {},
    ]
    assert step(holder, {1: [out("s", 9, finish="stop")]}) == {1: [("s", [8, 9], "stop")]}


def test_other_requests_and_clients_are_untouched():
    requests = {"f": request(), "l": request(logprobs=1)}
    holder = OutputHolder(requests.get, stream_interval=1)
    step(holder, {0: [out("f", 1)], 1: [out("l", 1)]})
    assert step(holder, {0: [out("f", 2)], 1: [out("l", 2)]}) == {1: [("l", [2], None)]}
    # a request the scheduler does not know (gone before its first output was filtered) is never held
    assert step(holder, {2: [out("x", 1)]}) == {2: [("x", [1], None)]}
    assert step(holder, {2: [out("x", 2)]}) == {2: [("x", [2], None)]}


def test_an_output_with_more_than_tokens_goes_with_what_was_held():
    holder = OutputHolder({"a": request()}.get, stream_interval=1)
    step(holder, {0: [out("a", 1)]})
    step(holder, {0: [out("a", 2)]})
    assert step(holder, {0: [out("a", 3, num_nans_in_logits=1)]}) == {0: [("a", [2, 3], None)]}


def test_a_message_with_more_than_outputs_is_still_sent():
    holder = OutputHolder({"a": request()}.get, stream_interval=1)
    step(holder, {0: [out("a", 1)]})
    sent = holder.filter({0: EngineCoreOutputs(outputs=[out("a", 2)], finished_requests={"b"})})
    assert list(sent) == [0] and sent[0].outputs == []


def test_aborted_requests_are_forgotten():
    requests = {"a": request()}
    holder = OutputHolder(requests.get, stream_interval=1)
    step(holder, {0: [out("a", 1)]})
    step(holder, {0: [out("a", 2)]})
    del requests["a"]  # aborted: the scheduler drops it and sends no final output
    for _ in range(CLEANUP_MESSAGES):
        holder.keeps(EngineCoreOutputs())
    assert len(holder) == 0
