"""The built-in stage variants (raw-prompt preprocess, OpenAI-style postprocess), without Triton."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from core.interface import STREAM_ECHO_ERROR, InvalidInput
from core.protocol import (
    EngineRequest,
    EngineResponse,
    SequenceDelta,
    TokenLogprob,
    decode_request,
    encode_response,
    merge_responses,
)
from postprocess.openai import OpenAIPostprocessor
from preprocess.raw import RawPreprocessor


def _text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def _raw(**inputs) -> EngineRequest:
    stage = RawPreprocessor({"max_logprobs": 5, "lora_names": ["a"], "tokenizer": "ignored"})
    return decode_request(stage.process(inputs, {})["engine_request"].item())


def test_raw_preprocess_sends_the_prompt_text_as_it_is():
    request = _raw(text_input=_text("<|im_start|>user\nHi"), sampling_parameters=_text('{"max_tokens": 3}'))
    assert (request.prompt, request.prompt_token_ids) == ("<|im_start|>user\nHi", None)
    assert request.sampling["max_tokens"] == 3
    assert request.postprocess_options == {"prompt_prefix": "<|im_start|>user\nHi", "return": []}


def test_raw_preprocess_keeps_the_vllm_backend_rules():
    streamed = _raw(text_input=_text("Hi"), stream=np.array([True]), return_finish_reason=np.array([True]))
    assert streamed.stream and streamed.postprocess_options == {"prompt_prefix": "", "return": ["return_finish_reason"]}
    with pytest.raises(InvalidInput, match=f"^{re.escape(STREAM_ECHO_ERROR)} exclude_input_in_output=false"):
        _raw(text_input=_text("Hi"), stream=np.array([True]), exclude_input_in_output=np.array([False]))
    with pytest.raises(InvalidInput, match="text_input is required"):
        _raw()
    with pytest.raises(InvalidInput, match=r"^LoRA b is not supported, we currently support \['a'\] \(lora_name='b'\)"):
        _raw(text_input=_text("Hi"), sampling_parameters=_text('{"lora_name": "b"}'))
    # max_tokens beyond the context goes to vLLM as it is: vLLM stops at the context (no tokenizer here)
    beyond = _raw(text_input=_text("Hi"), sampling_parameters=_text('{"max_tokens": 1500}'))
    assert beyond.sampling["max_tokens"] == 1500


def _response(
    text: str, tokens: list[int], finished: bool, streamed: bool, reason: str | None = None
) -> EngineResponse:
    return EngineResponse(
        outputs=[SequenceDelta(0, text, tokens, finish_reason=reason)],
        num_input_tokens=4,
        finished=finished,
        request_id="triton-7",
        streamed=streamed,
    )


def _document(response: EngineResponse) -> dict:
    stage = OpenAIPostprocessor({"model_name": "chat_model"})
    encoded = np.array([encode_response(response)], dtype=np.object_)
    raw = stage.process({"engine_response": encoded}, {})["chat_completion"]
    assert raw.shape == (1,)
    return json.loads(raw[0])


def test_openai_postprocess_turns_stream_deltas_into_chunks_and_a_whole_answer_into_a_completion():
    deltas = [_response("Grü", [5, 6], False, True), _response("ße", [7], True, True, "length")]
    chunks = [_document(d) for d in deltas]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 2
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": "Grü"},
        {"role": "assistant", "content": "ße"},
    ]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, "length"]
    assert {c["id"] for c in chunks} == {"chatcmpl-triton-7"} and chunks[0]["model"] == "chat_model"
    assert "usage" not in chunks[1]

    whole = _document(merge_responses(deltas))  # what the plain ensemble's generate step hands over
    assert whole["object"] == "chat.completion" and whole["id"] == "chatcmpl-triton-7"
    assert whole["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "Grüße"}, "logprobs": None, "finish_reason": "length"}
    ]
    assert whole["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def test_openai_postprocess_logprobs_name_the_sampled_token_and_the_alternatives():
    response = _response("ab", [5, 6], True, False, "stop")
    response.outputs[0].logprobs = [
        {"5": TokenLogprob(-0.1, 1, "a"), "9": TokenLogprob(-2.5, 2, "z")},
        {"8": TokenLogprob(-0.2, 1, "y"), "6": TokenLogprob(-1.5, 3, "b")},  # the sampled token need not be the top one
    ]
    content = _document(response)["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in content] == [("a", -0.1), ("b", -1.5)]
    assert content[1]["top_logprobs"] == [{"token": "y", "logprob": -0.2}, {"token": "b", "logprob": -1.5}]
