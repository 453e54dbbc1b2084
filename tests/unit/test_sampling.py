"""preprocess.sampling: strict, typed sampling parameters; every input is accepted typed or rejected clearly."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.interface import InvalidInput
from preprocess.sampling import NEWER_VLLM_ONLY, NOT_SETTABLE, SAMPLING_RULES, validate_sampling


def test_every_rule_is_a_vllm_sampling_param():
    from vllm.sampling_params import SamplingParams

    fields = (
        {f.name for f in dataclasses.fields(SamplingParams)}
        if dataclasses.is_dataclass(SamplingParams)
        else set(SamplingParams.__annotations__)
    )
    ours = set(SAMPLING_RULES) - {"lora_name", "guided_decoding"}
    assert ours - fields <= NEWER_VLLM_ONLY, ours - fields - NEWER_VLLM_ONLY  # an older vLLM lacks only those


def test_every_client_settable_vllm_sampling_param_has_a_rule():
    """Completeness against the installed vLLM: a new SamplingParams field fails this test until it is listed."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    public = {f.name for f in msgspec.structs.fields(SamplingParams) if not f.name.startswith("_")}
    assert public - set(SAMPLING_RULES) - set(NOT_SETTABLE) == set()
    assert set(NOT_SETTABLE) - public <= NEWER_VLLM_ONLY


@pytest.mark.parametrize("key", sorted(NOT_SETTABLE))
def test_engine_internal_fields_are_refused_with_the_reason(key):
    with pytest.raises(InvalidInput, match=f"'{key}' cannot be set per request: "):
        validate_sampling(json.dumps({key: 1}), {})


def test_structured_outputs_are_checked_before_the_engine():
    assert validate_sampling('{"structured_outputs": {"json": "{\\"type\\": \\"object\\"}"}}', {}) == {
        "structured_outputs": {"json": '{"type": "object"}'}
    }
    got = validate_sampling(None, {"structured_outputs": '{"regex": "[a-z]+", "disable_any_whitespace": "true"}'})
    assert got == {"structured_outputs": {"regex": "[a-z]+", "disable_any_whitespace": True}}
    for doc, message in [
        ({"choice": []}, "must be a non-empty list of strings"),
        ({"json": "{not json"}, "structured_outputs.json: not a JSON schema"),
        ({"regex": "a", "choice": ["a"]}, "set exactly one of json, regex, choice"),
        ({"disable_any_whitespace": True}, "(got none)"),
        ({"regx": "a"}, "unknown key 'regx'"),
    ]:
        with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
            validate_sampling(json.dumps({"structured_outputs": doc}), {})


def test_vllm_rules_that_span_fields():
    with pytest.raises(InvalidInput, match=r"n=2: must be 1 with greedy sampling"):
        validate_sampling('{"n": 2, "temperature": 0}', {})
    with pytest.raises(InvalidInput, match=r"logprobs=-1: the whole vocabulary needs"):
        validate_sampling('{"logprobs": -1}', {}, max_logprobs=20)
    assert validate_sampling('{"logprobs": -1}', {}, max_logprobs=-1) == {"logprobs": -1}
    with pytest.raises(InvalidInput, match=r"min_count must be >= 2"):
        validate_sampling('{"repetition_detection": {"max_pattern_size": 3, "min_count": 1}}', {})


def test_string_forms_are_accepted_as_the_vllm_backend_accepts_them():
    got = validate_sampling('{"temperature": "0.5", "max_tokens": "16", "ignore_eos": "true"}', {})
    assert got == {"temperature": 0.5, "max_tokens": 16, "ignore_eos": True}
    assert type(got["max_tokens"]) is int and type(got["temperature"]) is float


def test_tensor_wins_over_request_parameters_per_key():
    got = validate_sampling('{"max_tokens": 3}', {"max_tokens": 9, "temperature": 0})
    assert got == {"max_tokens": 3, "temperature": 0.0}


def test_triton_frontend_parameters_are_not_sampling_parameters():
    assert validate_sampling(None, {"binary_data_output": True, "triton_enable_empty_final_response": True}) == {}


def test_lists_may_arrive_json_encoded_in_request_parameters():
    assert validate_sampling(None, {"stop": '["a", "b"]'}) == {"stop": ["a", "b"]}
    assert validate_sampling(None, {"stop": "[not json"}) == {"stop": "[not json"}  # a stop string may start so


def test_a_list_or_object_parameter_that_is_not_json_says_so():
    """The same reader as the chat options' (core.stage.parse_json_container): the field and JSON's complaint."""
    with pytest.raises(InvalidInput, match=r"^stop_token_ids: invalid JSON \(Expecting value at position 4\)$"):
        validate_sampling(None, {"stop_token_ids": "[1, "})
    with pytest.raises(InvalidInput, match=r"^logit_bias: invalid JSON"):
        validate_sampling(None, {"logit_bias": "{5: 1}"})


def test_null_keeps_the_default():
    assert validate_sampling('{"seed": null}', {}) == {}


def test_guided_decoding_is_mapped_to_structured_outputs():
    got = validate_sampling('{"guided_decoding": {"choice": ["a", "b"], "backend": "xgrammar"}}', {})
    assert got == {"structured_outputs": {"choice": ["a", "b"]}}


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"n": 0}, "n=0: must be >= 1"),
        ({"top_k": -2}, "top_k=-2: must be -1 or 0"),
        ({"min_p": 2}, "min_p=2: must be in [0, 1]"),
        ({"presence_penalty": 3}, "presence_penalty=3: must be in [-2, 2]"),
        ({"repetition_penalty": 0}, "repetition_penalty=0: must be > 0"),
        ({"temperature": "nan"}, "temperature: must be a finite number"),
        ({"max_tokens": True}, "max_tokens: expected an integer, got boolean"),
        ({"stop": [1]}, "stop[0]: expected a string, got 1"),
        ({"stop_token_ids": [-1]}, "stop_token_ids=[-1]: token ids must be >= 0"),
        ({"ignore_eos": "maybe"}, "ignore_eos: expected a boolean, got 'maybe'"),
        ({"logit_bias": {"x": 1}}, "logit_bias key: expected an integer, got 'x'"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens=5 must be <= max_tokens=2"),
        ({"structured_outputs": 3}, "structured_outputs: expected a JSON object"),
        ({"temperature": 2.5}, "temperature=2.5: must be in [0, 2]"),
        ({"stop": ["a", ""]}, "stop strings must not be empty"),
        ({"bad_words": [""]}, "bad words must not be empty"),
        ({"seed": 2**64}, f"seed={2**64}: must fit in 64 bits"),
        ({"stream_interval": 0}, "stream_interval=0: must be >= 1"),
        ({"thinking_token_budget": -1}, "thinking_token_budget=-1: must be >= 0"),
        ({"extra_args": [1]}, "extra_args: expected a JSON object"),
    ],
)
def test_bad_values_name_field_value_and_rule(doc, message):
    with pytest.raises(InvalidInput) as failure:
        validate_sampling(json.dumps(doc), {})
    assert message in str(failure.value)


def test_engine_limits_from_the_deployment():
    with pytest.raises(InvalidInput, match=r"logprobs=21: must be <= 20"):
        validate_sampling('{"logprobs": 21}', {}, max_logprobs=20)


def test_lora_errors_start_with_the_vllm_backends_texts():
    # The backend's texts verbatim (its clients and CI match them), our field-naming detail after them
    with pytest.raises(InvalidInput) as unknown:
        validate_sampling('{"lora_name": "x"}', {}, known_loras=frozenset({"b", "a"}))
    assert str(unknown.value) == "LoRA x is not supported, we currently support ['a', 'b'] (lora_name='x')"
    with pytest.raises(InvalidInput) as disabled:
        validate_sampling('{"lora_name": "x"}', {}, known_loras=frozenset())
    assert str(disabled.value).startswith("LoRA feature is not enabled. lora_name='x'")
    # A stage that was given no list of adapters leaves the check to the core
    assert validate_sampling('{"lora_name": "x"}', {})["lora_name"] == "x"


def test_the_core_refuses_an_unserved_adapter_with_the_same_texts_as_preprocess():
    """One rule (core.interface.check_lora) on both sides: a deployment's own preprocess may not check."""
    from core.engine import Engine

    for served in ({"b": "/b", "a": "/a"}, {}):
        with pytest.raises(InvalidInput) as preprocess:
            validate_sampling('{"lora_name": "x"}', {}, known_loras=frozenset(served))
        with pytest.raises(InvalidInput) as core:
            Engine({}, lora_adapters=served, offload_detokenization=False)._lora_request("x")
        assert str(core.value) == str(preprocess.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
keys = st.sampled_from(sorted(SAMPLING_RULES)) | st.text(max_size=12)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(keys, json_values, max_size=5),
    st.dictionaries(keys, st.booleans() | st.integers() | st.text(max_size=6), max_size=3),
)
@example(doc={"n": 16385}, parameters={})  # found by hypothesis: over vLLM's VLLM_MAX_N_SEQUENCES
def test_any_json_is_accepted_typed_or_rejected_with_a_message(doc, parameters):
    try:
        got = validate_sampling(json.dumps(doc), parameters)
    except InvalidInput as exc:
        assert str(exc)
        return
    for key, value in got.items():
        assert key in SAMPLING_RULES
        assert value is not None
        if key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            assert type(value) is float
        if key in ("n", "top_k", "seed", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs"):
            assert type(value) is int
    _vllm_accepts(got)


def _vllm_accepts(checked: dict) -> None:
    """What preprocess accepts, vLLM's SamplingParams accepts too, built exactly as the core builds it (only
    model-dependent checks, such as vocabulary ranges or max_logprobs, are left to the engine)."""
    import vllm.envs

    from core.protocol import EngineRequest, decode_request, encode_request
    from core.vllm_io import sampling_param_fields, sampling_params

    request = decode_request(encode_request(EngineRequest(sampling=checked)))  # as it travels
    newer = set(checked) - {"lora_name"} - sampling_param_fields()
    for offload in (False, True):
        if checked.get("n", 1) > vllm.envs.VLLM_MAX_N_SEQUENCES:
            # The engine process's own limit (an engine_env setting): the core refuses it, naming the variable.
            with pytest.raises(InvalidInput, match="VLLM_MAX_N_SEQUENCES"):
                sampling_params(request, offload_detokenization=offload)
        elif newer:  # a field of a newer vLLM than the installed one: refused by name
            assert newer <= NEWER_VLLM_ONLY, newer
            with pytest.raises(InvalidInput, match="is not supported by the installed vLLM"):
                sampling_params(request, offload_detokenization=offload)
        else:
            sampling_params(request, offload_detokenization=offload)


structured = st.fixed_dictionaries(
    {},
    optional={
        "json": st.sampled_from(['{"type": "object"}', {"type": "string"}, "{bad"]),
        "regex": st.text(max_size=5),
        "choice": st.lists(st.text(max_size=3), max_size=3),
        "disable_any_whitespace": st.booleans(),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "n": st.integers(-1, 3),
            "temperature": st.floats(-1, 3) | st.sampled_from(["0", "0.5", "x"]),
            "top_p": st.floats(-0.5, 1.5),
            "top_k": st.integers(-3, 50),
            "min_p": st.floats(-0.5, 1.5),
            "presence_penalty": st.floats(-3, 3),
            "repetition_penalty": st.floats(-1, 3),
            "max_tokens": st.integers(-1, 64) | st.sampled_from(["16", "x"]),
            "min_tokens": st.integers(-1, 64),
            "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
            "seed": st.integers(-(2**70), 2**70),
            "logprobs": st.integers(-2, 30),
            "structured_outputs": structured,
            "stream_interval": st.integers(-1, 4),
            "repetition_detection": st.fixed_dictionaries(
                {}, optional={k: st.integers(-1, 4) for k in ("max_pattern_size", "min_pattern_size", "min_count")}
            ),
        },
    )
)
def test_whatever_preprocess_accepts_vllm_accepts(doc):
    try:
        got = validate_sampling(json.dumps(doc), {}, max_logprobs=20)
    except InvalidInput as exc:
        assert str(exc)
        return
    _vllm_accepts(got)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_any_tensor_text_is_accepted_or_rejected_with_a_message(text):
    try:
        validate_sampling(text, {})
    except InvalidInput as exc:
        assert str(exc)


def test_the_cores_sampling_params_are_copied_shallowly_by_vllm():
    """Built afresh for each request and never reused, so vLLM's input processing may copy them shallowly (as vLLM's
    own OpenAI server asks) instead of deep-copying them."""
    from core.protocol import EngineRequest
    from core.vllm_io import sampling_params

    stop = ["</s>", "END"]
    request = EngineRequest(sampling={"max_tokens": 8, "stop": stop})
    params = sampling_params(request, offload_detokenization=True)
    assert params.skip_clone
    clone = params.clone()
    assert clone is not params and clone.max_tokens == 8 and clone.stop == ["</s>", "END"]
    assert sampling_params(request, offload_detokenization=True) is not params  # a new one each time
