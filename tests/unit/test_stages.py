"""The default stages and the wire protocol, without Triton."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from core.interface import ENGINE_RESPONSE, STREAM_ECHO_ERROR, InvalidInput, document_tensor
from core.protocol import (
    DecodeError,
    EngineRequest,
    EngineResponse,
    ResponseHeader,
    RgbImage,
    SequenceDelta,
    TokenLogprob,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_response,
    merge_responses,
    peek_response,
    whole_answer,
)
from postprocess.vllm_backend import VllmBackendPostprocessor
from preprocess.default import Preprocessor


@pytest.fixture(scope="module")
def preprocessor(tiny_model):
    return Preprocessor({"tokenizer": str(tiny_model), "max_model_len": 64, "max_logprobs": 5, "lora_names": []})


def _text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def _request(preprocessor, **inputs) -> EngineRequest:
    out = preprocessor.process(inputs, {})
    return decode_request(out["engine_request"].item())


def test_preprocess_tokenizes_like_the_model_tokenizer(preprocessor):
    request = _request(preprocessor, text_input=_text("Grüße aus München"))
    assert request.prompt_token_ids == preprocessor.tokenizer.encode("Grüße aus München")
    assert request.stream is False
    assert request.postprocess_options == {"prompt_prefix": "Grüße aus München", "return": []}


def test_preprocess_echo_rules_follow_the_vllm_backend(preprocessor):
    streaming = _request(preprocessor, text_input=_text("Hi"), stream=np.array([True]))
    assert streaming.postprocess_options["prompt_prefix"] == ""
    excluded = _request(preprocessor, text_input=_text("Hi"), exclude_input_in_output=np.array([True]))
    assert excluded.postprocess_options["prompt_prefix"] == ""
    with pytest.raises(InvalidInput, match=f"^{re.escape(STREAM_ECHO_ERROR)} exclude_input_in_output=false"):
        _request(
            preprocessor, text_input=_text("Hi"), stream=np.array([True]), exclude_input_in_output=np.array([False])
        )


def test_preprocess_rejects_missing_or_malformed_prompt(preprocessor):
    with pytest.raises(InvalidInput, match="exactly one of text_input and messages"):
        preprocessor.process({}, {})
    with pytest.raises(InvalidInput, match="text_input: not valid UTF-8"):
        preprocessor.process({"text_input": np.array([b"\xff\xfe"], dtype=np.object_)}, {})
    with pytest.raises(InvalidInput, match="text_input: expected exactly one element"):
        preprocessor.process({"text_input": np.array([b"a", b"b"], dtype=np.object_)}, {})


def test_preprocess_rejects_prompts_that_leave_no_room_to_generate(preprocessor):
    def words(tokens: int) -> str:  # "word " * k with exactly `tokens` tokens
        k = next(k for k in range(1, 300) if len(preprocessor.tokenizer.encode("word " * k)) == tokens)
        return "word " * k

    with pytest.raises(InvalidInput, match="prompt is 70 tokens long; the model's context is 64 tokens"):
        preprocessor.process({"text_input": _text(words(70))}, {})
    with pytest.raises(InvalidInput, match="prompt is 64 tokens long.* at least one must be left to generate"):
        preprocessor.process({"text_input": _text(words(64))}, {})
    # One token of room is enough, however large max_tokens is
    assert _sampling(preprocessor, words(63), {"max_tokens": 1500})["max_tokens"] == 1


def _sampling(preprocessor, prompt: str, sampling: dict) -> dict:
    inputs = {"text_input": _text(prompt), "sampling_parameters": _text(json.dumps(sampling))}
    return decode_request(preprocessor.process(inputs, {})["engine_request"].item()).sampling


def test_preprocess_accepts_max_tokens_beyond_the_context_and_clamps_it_to_the_room_left(preprocessor):
    # As vLLM and the vLLM backend: accepted, and generation stops at the context (finish reason "length")
    room = 64 - len(preprocessor.tokenizer.encode("Hello there"))
    assert _sampling(preprocessor, "Hello there", {"max_tokens": 1500})["max_tokens"] == room
    assert _sampling(preprocessor, "Hello there", {"max_tokens": room})["max_tokens"] == room
    assert _sampling(preprocessor, "Hello there", {"max_tokens": room - 1})["max_tokens"] == room - 1
    # min_tokens must stay <= max_tokens for vLLM's SamplingParams; vLLM stops at the context before it anyway
    clamped = _sampling(preprocessor, "Hello there", {"max_tokens": 1500, "min_tokens": 1000})
    assert (clamped["max_tokens"], clamped["min_tokens"]) == (room, room)
    kept = _sampling(preprocessor, "Hello there", {"max_tokens": 1500, "min_tokens": 3})
    assert (kept["max_tokens"], kept["min_tokens"]) == (room, 3)
    # Unset max_tokens is vLLM's default of 16; a prompt that leaves less room gets the room
    long_prompt = "word " * 52
    short_room = 64 - len(preprocessor.tokenizer.encode(long_prompt))
    assert 0 < short_room < 16
    assert _sampling(preprocessor, long_prompt, {})["max_tokens"] == short_room
    assert "max_tokens" not in _sampling(preprocessor, "Hello there", {})
    with pytest.raises(InvalidInput, match=r"max_tokens=9223372036854775808: must be >= 1 \(and below 2\*\*63\)"):
        _sampling(preprocessor, "Hello there", {"max_tokens": 2**63})


def _response(**options) -> EngineResponse:
    return EngineResponse(
        outputs=[
            SequenceDelta(
                0,
                "bonjour",
                [5, 6],
                "length",
                None,
                -1.5,
                [{"5": TokenLogprob(-0.5, 1, "bon")}, {"6": TokenLogprob(-1.0, 1, "jour")}],
            ),
            SequenceDelta(1, "hi", [7], None, None, None, None),
        ],
        num_input_tokens=3,
        finished=True,
        postprocess_options=options,
    )


def _post(response: EngineResponse) -> dict[str, np.ndarray]:
    raw = document_tensor(ENGINE_RESPONSE, encode_response(response))
    return VllmBackendPostprocessor({}).process({"engine_response": raw}, {})


def test_postprocess_outputs_only_what_was_asked():
    out = _post(_response(prompt_prefix="Say: ", **{"return": []}))
    assert set(out) == {"text_output"}
    assert out["text_output"].tolist() == [b"Say: bonjour", b"Say: hi"]


def test_postprocess_all_outputs_with_the_vllm_backend_types():
    flags = [
        "return_finish_reason",
        "return_cumulative_logprob",
        "return_logprobs",
        "return_num_input_tokens",
        "return_num_output_tokens",
    ]
    out = _post(_response(prompt_prefix="", **{"return": flags}))
    assert out["finish_reason"].tolist() == [b"length", b"None"]
    assert out["cumulative_logprob"].dtype == np.float32
    assert out["cumulative_logprob"][0] == pytest.approx(-1.5) and math.isnan(out["cumulative_logprob"][1])
    assert json.loads(out["logprobs"][0]) == [
        {"5": {"logprob": -0.5, "rank": 1, "decoded_token": "bon"}},
        {"6": {"logprob": -1.0, "rank": 1, "decoded_token": "jour"}},
    ]
    assert out["logprobs"][1] == b"null"
    assert out["num_input_tokens"].tolist() == [3] and out["num_input_tokens"].dtype == np.uint32
    assert out["num_output_tokens"].tolist() == [2, 1] and out["num_output_tokens"].dtype == np.uint32


def test_merge_joins_deltas_per_sequence():
    deltas = [
        EngineResponse([SequenceDelta(0, "a", [1]), SequenceDelta(1, "x", [9])], 4, False, {"k": 1}),
        EngineResponse([SequenceDelta(0, "b", [2], "stop", "b", -2.0, None)], 4, False, {"k": 1}),
        EngineResponse([SequenceDelta(1, "y", [8], "length")], 4, True, {"k": 1}),
    ]
    merged = merge_responses(deltas)
    assert [(s.index, s.text, s.token_ids, s.finish_reason) for s in merged.outputs] == [
        (0, "ab", [1, 2], "stop"),
        (1, "xy", [9, 8], "length"),
    ]
    assert merged.finished and merged.num_input_tokens == 4 and merged.postprocess_options == {"k": 1}
    assert decode_response(encode_response(merged)) == merged
    with pytest.raises(ValueError):
        merge_responses([])


def test_merge_takes_the_window_of_the_first_delta_with_tokens():
    quiet = SequenceDelta(1, "", [], context_ids=[])
    first = SequenceDelta(1, "", [7, 8], context_ids=[5, 6], context_prompt_tokens=2)
    later = SequenceDelta(1, "", [9], context_ids=[8], context_prompt_tokens=0)
    merged = merge_responses(
        [
            EngineResponse([quiet], 2, False, {}, decode={}),
            EngineResponse([first], 2, False, {}, decode={}),
            EngineResponse([later], 2, True, {}, decode={}),
        ]
    )
    seq = merged.outputs[0]
    assert (seq.token_ids, seq.context_ids, seq.context_prompt_tokens) == ([7, 8, 9], [5, 6], 2)
    assert merged.decode == {}


# The wire format (core/protocol.py) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b'{"sampling": {}, "prompt_token_ids": [1, "2"]}', "Expected `int`, got `str` - at `$.prompt_token_ids[1]`"),
        (b'{"sampling": [], "prompt_token_ids": [1]}', "Expected `object`, got `array` - at `$.sampling`"),
        (b'{"sampling": {}, "stream": "yes"}', "Expected `bool`, got `str` - at `$.stream`"),
        (b'{"sampling": {}, "images": [{"width": 2, "height": 1}]}', "missing required field `rgb` - at `$.images[0]`"),
        (b'{"sampling": {}, "promt": "Hi"}', "Object contains unknown field `promt`"),
        (b'{"prompt": "Hi"}', "Object missing required field `sampling`"),
        (b'{"sampling": {}', "Input data was truncated"),
        (b"sampling=1", "JSON is malformed"),
    ],
)
def test_an_engine_request_of_the_wrong_shape_is_refused_naming_the_field(document, message):
    # The core answers these with INVALID_ARG "engine_request: malformed (<this message>)" (test_bad_input.py)
    with pytest.raises(DecodeError, match=re.escape(message)):
        decode_request(document)


def test_an_engine_request_round_trips_with_its_images_as_base64_json():
    request = EngineRequest(
        sampling={"max_tokens": 3, "seed": 2**70, "stop": ["\n"]},
        prompt_token_ids=[1, 2],
        images=[RgbImage(2, 1, bytes([255, 0, 0, 0, 0, 255]))],
        postprocess_options={"prompt_prefix": "Grüße", "return": []},
    )
    encoded = encode_request(request)
    assert json.loads(encoded)["images"] == [{"width": 2, "height": 1, "rgb": "/wAAAAD/"}]  # readable JSON
    assert decode_request(encoded) == request


def test_token_logprobs_round_trip_every_float_the_engine_gives():
    """-inf is what vLLM gives tokens that top-k/top-p masked (logprobs_mode processed_logprobs): JSON has no -inf,
    so engine_response is MessagePack; the public logprobs keep Python json's text for it, as before."""
    entries = {"5": TokenLogprob(-0.25, 1, "Grü"), "9": TokenLogprob(-math.inf, 2), "7": TokenLogprob(-1e-05, None)}
    response = EngineResponse(
        [SequenceDelta(0, "Grü", [5], "length", None, -0.25, [entries])],
        3,
        True,
        {"prompt_prefix": "", "return": ["return_logprobs"]},
        prompt_logprobs=[None, {"4": TokenLogprob(-3.5, 7, "x")}],
    )
    decoded = decode_response(encode_response(response))
    assert decoded == response
    assert decoded.outputs[0].logprobs[0]["9"] == TokenLogprob(logprob=-math.inf, rank=2, decoded_token=None)
    nan = decode_response(encode_response(EngineResponse([SequenceDelta(0, "", [], None, None, math.nan)], 0, True)))
    assert math.isnan(nan.outputs[0].cumulative_logprob)
    assert _post(response)["logprobs"][0] == (
        b'[{"5": {"logprob": -0.25, "rank": 1, "decoded_token": "Gr\\u00fc"},'
        b' "9": {"logprob": -Infinity, "rank": 2, "decoded_token": null},'
        b' "7": {"logprob": -1e-05, "rank": null, "decoded_token": null}}]'
    )


def test_whole_answer_passes_a_lone_answer_as_it_is_and_merges_streamed_deltas():
    answer = encode_response(EngineResponse([SequenceDelta(0, "ab", [1, 2], "length")], 4, True, request_id="r"))
    assert whole_answer([answer]) is answer  # the plain path: neither decoded nor encoded again
    deltas = [
        EngineResponse([SequenceDelta(0, "a", [1])], 4, False, streamed=True),
        EngineResponse([SequenceDelta(0, "b", [2], "length")], 4, True, streamed=True),
    ]
    merged = decode_response(whole_answer([encode_response(d) for d in deltas]))
    assert merged == merge_responses(deltas) and not merged.streamed and merged.outputs[0].text == "ab"
    lone_delta = decode_response(whole_answer([encode_response(deltas[1])]))
    assert not lone_delta.streamed  # a stream of one delta still becomes a whole answer
    assert peek_response(encode_response(deltas[0])) == ResponseHeader(finished=False, streamed=True)


def test_an_in_band_error_ends_the_request_and_a_peek_reads_it():
    """The core's error for a BLS caller (EngineResponse.error): the last response, no outputs, the tagged message."""
    document = encode_response(error_response("[UNAVAILABLE] the vLLM engine failed"))
    assert peek_response(document) == ResponseHeader(finished=True, error="[UNAVAILABLE] the vLLM engine failed")
    assert decode_response(document).outputs == []
    # a data response's peek says it carries none
    assert peek_response(encode_response(EngineResponse([SequenceDelta(0, "a", [1])], 4, True))).error is None
