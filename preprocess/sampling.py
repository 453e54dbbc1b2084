"""Strict sampling-parameter validation: JSON tensor and request parameters -> a typed, checked dict.

Every key a client may set is listed here with its type and rule. Values may come as JSON values or as the
strings the Triton vLLM backend accepts ("0.1", "true", "16"). Whatever fails gets an `InvalidInput` naming the
field, the value and the rule; the core then builds vLLM's own `SamplingParams` from the result, so vLLM's
validation runs too (its errors also reach the client as INVALID_ARG).
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.interface import InvalidInput, check_lora
from core.stage import parse_bool, parse_json_container, parse_json_object
from core.vllm_defaults import FALLBACK_MAX_TOKENS

# Request parameters that Triton's frontends or clients set for themselves; they are not sampling parameters.
TRITON_REQUEST_PARAMETERS = frozenset(
    {"binary_data_output", "sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers"}
)


def _to_int(value: Any, field: str) -> int:
    if isinstance(value, bool):
        raise InvalidInput(f"{field}: expected an integer, got boolean {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InvalidInput(f"{field}: expected an integer, got {value!r}")


def _to_float(value: Any, field: str) -> float:
    if isinstance(value, bool):
        raise InvalidInput(f"{field}: expected a number, got boolean {value!r}")
    if isinstance(value, (int, float)):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            raise InvalidInput(f"{field}: expected a number, got {value!r}") from None
    else:
        raise InvalidInput(f"{field}: expected a number, got {value!r}")
    if not math.isfinite(result):
        raise InvalidInput(f"{field}: must be a finite number, got {value!r}")
    return result


def _to_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{field}: expected a string, got {value!r}")
    return value


def _str_list(value: Any, field: str) -> list[str]:
    value = parse_json_container(value, field)
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: expected a list of strings, got {value!r}")
    return [_to_str(v, f"{field}[{i}]") for i, v in enumerate(value)]


def _int_list(value: Any, field: str) -> list[int]:
    value = parse_json_container(value, field)
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: expected a list of integers, got {value!r}")
    return [_to_int(v, f"{field}[{i}]") for i, v in enumerate(value)]


def _stop(value: Any, field: str) -> str | list[str]:
    value = parse_json_container(value, field, keep_invalid=True)  # "[INST" is a stop string
    if isinstance(value, str):
        return value
    return _str_list(value, field)


def _logit_bias(value: Any, field: str) -> dict[int, float]:
    value = parse_json_container(value, field)
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected an object of token id -> bias, got {value!r}")
    return {_to_int(k, f"{field} key"): _to_float(v, f"{field}[{k}]") for k, v in value.items()}


def _object(value: Any, field: str) -> dict[str, Any]:
    value = parse_json_container(value, field)
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected a JSON object, got {value!r}")
    return value


def _non_empty_strings(values: str | list[str]) -> bool:
    return all(values) if isinstance(values, list) else bool(values)


# vLLM's StructuredOutputsParams: the constraint kinds (exactly one per request) and the options beside them.
_STRUCTURED_KINDS: dict[str, Callable[[Any, str], Any]] = {
    "json": lambda v, f: _json_schema(v, f),
    "regex": _to_str,
    "choice": lambda v, f: _str_list(v, f) or _fail(f, v, "must be a non-empty list of strings"),
    "grammar": _to_str,
    "json_object": parse_bool,
    "structural_tag": _to_str,
}
_STRUCTURED_OPTIONS: dict[str, Callable[[Any, str], Any]] = {
    "disable_any_whitespace": parse_bool,
    "disable_additional_properties": parse_bool,
    "whitespace_pattern": _to_str,
}
# Keys of the legacy `guided_decoding` object that vLLM no longer takes per request (the backend is an engine
# argument now): accepted and dropped, as before.
_LEGACY_GUIDED_KEYS = frozenset({"backend", "backend_was_auto", "disable_fallback"})


def _fail(field: str, value: Any, rule: str) -> Any:
    raise InvalidInput(f"{field}={value!r}: {rule}")


def _json_schema(value: Any, field: str) -> str | dict[str, Any]:
    """A JSON schema as an object, or as a string that holds one."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            schema = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{field}: not a JSON schema ({exc.msg} at position {exc.pos})") from None
        if isinstance(schema, (dict, bool)):
            return value
    raise InvalidInput(f"{field}: expected a JSON schema (object or JSON string), got {value!r:.100}")


def _structured(value: Any, field: str, legacy: bool = False) -> dict[str, Any]:
    doc = _object(value, field)
    checked: dict[str, Any] = {}
    for key, raw in doc.items():
        parse = _STRUCTURED_KINDS.get(key) or _STRUCTURED_OPTIONS.get(key)
        if parse is None:
            if legacy and key in _LEGACY_GUIDED_KEYS:
                continue
            known = ", ".join([*_STRUCTURED_KINDS, *_STRUCTURED_OPTIONS])
            raise InvalidInput(f"{field}: unknown key {key!r} (known: {known})")
        if raw is not None:
            checked[key] = parse(raw, f"{field}.{key}")
    kinds = [k for k in _STRUCTURED_KINDS if checked.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise InvalidInput(
            f"{field}: set exactly one of {', '.join(_STRUCTURED_KINDS)}"
            + (f" (got {', '.join(kinds)})" if kinds else " (got none)")
        )
    return checked


def _legacy_structured(value: Any, field: str) -> dict[str, Any]:
    return _structured(value, field, legacy=True)


def _repetition_detection(value: Any, field: str) -> dict[str, int]:
    doc = _object(value, field)
    allowed = ("max_pattern_size", "min_pattern_size", "min_count")
    unknown = sorted(set(doc) - set(allowed))
    if unknown:
        raise InvalidInput(f"{field}: unknown key {unknown[0]!r} (known: {', '.join(allowed)})")
    got = {k: _to_int(v, f"{field}.{k}") for k, v in doc.items() if v is not None}
    low, high, count = (got.get(k, 0) for k in ("min_pattern_size", "max_pattern_size", "min_count"))
    if low < 0 or high < 0 or low > high:
        raise InvalidInput(f"{field}={doc!r}: sizes must be >= 0 with min_pattern_size <= max_pattern_size")
    if high > 0 and count < 2:
        raise InvalidInput(f"{field}={doc!r}: min_count must be >= 2 when max_pattern_size > 0")
    return got


@dataclass(frozen=True)
class Rule:
    parse: Callable[[Any, str], Any]
    check: Callable[[Any], bool] | None = None
    rule: str = ""


_BOOL = Rule(parse_bool)

# Keys are vLLM 0.32 SamplingParams fields (a test checks that every client-settable field is here or in
# NOT_SETTABLE), plus `lora_name` and the legacy `guided_decoding`. Ranges are vLLM's own (SamplingParams.
# _verify_args), checked here so the client hears of them before the request reaches the engine; the core then
# builds SamplingParams, whose validation (and the engine's model-dependent checks: vocabulary ranges,
# max_logprobs, structured-output compilation) also ends as INVALID_ARG.
SAMPLING_RULES: dict[str, Rule] = {
    "n": Rule(_to_int, lambda v: v >= 1, "must be >= 1"),
    "presence_penalty": Rule(_to_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "frequency_penalty": Rule(_to_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "repetition_penalty": Rule(_to_float, lambda v: v > 0.0, "must be > 0"),
    "temperature": Rule(_to_float, lambda v: 0.0 <= v <= 2.0, "must be in [0, 2]"),
    "top_p": Rule(_to_float, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    "top_k": Rule(_to_int, lambda v: v >= -1, "must be -1 or 0 (disabled) or a positive integer"),
    "min_p": Rule(_to_float, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    # The engine's MessagePack transport and torch generators take 64-bit seeds only.
    "seed": Rule(_to_int, lambda v: -(2**63) <= v < 2**64, "must fit in 64 bits"),
    "stop": Rule(_stop, _non_empty_strings, "stop strings must not be empty"),
    "stop_token_ids": Rule(_int_list, lambda v: all(t >= 0 for t in v), "token ids must be >= 0"),
    "bad_words": Rule(_str_list, _non_empty_strings, "bad words must not be empty"),
    "ignore_eos": _BOOL,
    # Beyond the context is accepted (generation stops there, finish reason "length"); the bound keeps
    # absurd values out of the engine's 64-bit fields.
    "max_tokens": Rule(_to_int, lambda v: 1 <= v < 2**63, "must be >= 1 (and below 2**63)"),
    "min_tokens": Rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "logprobs": Rule(_to_int, lambda v: v >= -1, "must be >= 0, or -1 for the whole vocabulary"),
    "prompt_logprobs": Rule(_to_int, lambda v: v >= -1, "must be >= 0, or -1 for the whole vocabulary"),
    "prompt_logprob_start": Rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "logprob_token_ids": Rule(_int_list, lambda v: all(t >= 0 for t in v), "token ids must be >= 0"),
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "include_stop_str_in_output": _BOOL,
    "logit_bias": Rule(_logit_bias),
    "allowed_token_ids": Rule(_int_list, lambda v: len(v) > 0, "must not be empty"),
    "structured_outputs": Rule(_structured),
    "guided_decoding": Rule(_legacy_structured),
    "stream_interval": Rule(_to_int, lambda v: v >= 1, "must be >= 1"),
    "skip_reading_prefix_cache": _BOOL,
    "thinking_token_budget": Rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "watermarking": _BOOL,
    "repetition_detection": Rule(_repetition_detection),
    "extra_args": Rule(_object),
    "lora_name": Rule(_to_str),
}

# Fields of vLLM 0.32's SamplingParams that vLLM 0.26 (the oldest supported) lacks. Checked here like the others;
# on a vLLM without them the core refuses them by name (INVALID_ARG), before SamplingParams would.
NEWER_VLLM_ONLY = frozenset(
    {"prompt_logprob_start", "stream_interval", "watermarking", "prompt_logprob_token_ids", "trace_decode_token_ids"}
)

# SamplingParams fields a client may not set here, and why (the message the client gets).
NOT_SETTABLE: dict[str, str] = {
    "output_kind": "the core sets it from `stream`",
    "detokenize": "the outputs are text: postprocess needs the detokenized text",
    "flat_logprobs": "the logprobs output has one fixed JSON form",
    "skip_clone": "an engine-internal optimisation",
    "output_text_buffer_length": "engine-internal",
    "prompt_logprob_token_ids": "needs vLLM's V2 model runner, and has no output tensor here",
    "trace_decode_token_ids": "needs an engine started with trace replay",
    "routed_experts_prompt_start": "engine-internal (MoE routing traces)",
}


def validate_sampling(
    tensor_json: str | None,
    request_parameters: Mapping[str, Any],
    *,
    max_logprobs: int | None = None,
    known_loras: frozenset[str] | None = None,
    default_max_tokens: int = FALLBACK_MAX_TOKENS,
) -> dict[str, Any]:
    """Merge the JSON tensor over the request parameters (the tensor wins per key) and check every value.
    `default_max_tokens`: vLLM's SamplingParams default, which the renderer writes into the stage's settings."""
    merged: dict[str, Any] = {
        k: v
        for k, v in request_parameters.items()
        if k not in TRITON_REQUEST_PARAMETERS and not k.startswith("triton_")
    }
    if tensor_json is not None:
        merged.update(parse_json_object(tensor_json, "sampling_parameters"))

    checked: dict[str, Any] = {}
    for key, raw in merged.items():
        rule = SAMPLING_RULES.get(key)
        if key in NOT_SETTABLE:
            raise InvalidInput(f"sampling parameter {key!r} cannot be set per request: {NOT_SETTABLE[key]}")
        if rule is None:
            close = difflib.get_close_matches(key, SAMPLING_RULES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidInput(f"unknown sampling parameter {key!r}{hint}")
        if raw is None:  # JSON null: keep vLLM's default, as the vLLM backend does
            continue
        value = rule.parse(raw, key)
        if rule.check is not None and not rule.check(value):
            raise InvalidInput(f"{key}={raw!r}: {rule.rule}")
        checked[key] = value

    if "guided_decoding" in checked:
        checked.setdefault("structured_outputs", checked.pop("guided_decoding"))
    if checked.get("n", 1) > 1 and checked.get("temperature", 1.0) < 1e-5:
        raise InvalidInput(f"n={checked['n']}: must be 1 with greedy sampling (temperature=0)")
    max_tokens = checked.get("max_tokens", default_max_tokens)
    if checked.get("min_tokens", 0) > max_tokens:
        given = "" if "max_tokens" in checked else " (vLLM's default)"
        raise InvalidInput(f"min_tokens={checked['min_tokens']} must be <= max_tokens={max_tokens}{given}")
    if max_logprobs is not None and max_logprobs != -1:
        for key in ("logprobs", "prompt_logprobs"):
            value = checked.get(key, 0)
            if value == -1:
                raise InvalidInput(f"{key}=-1: the whole vocabulary needs the engine's max_logprobs=-1")
            if value > max_logprobs:
                raise InvalidInput(f"{key}={value}: must be <= {max_logprobs} (the engine's max_logprobs)")
    check_lora(checked.get("lora_name"), known_loras)
    return checked
