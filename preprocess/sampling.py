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

from core.interface import InvalidInput
from core.stage import parse_bool

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


def _maybe_json(value: Any) -> Any:
    """Lists and objects may arrive JSON-encoded in a string (request parameters cannot carry them)."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _str_list(value: Any, field: str) -> list[str]:
    value = _maybe_json(value)
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: expected a list of strings, got {value!r}")
    return [_to_str(v, f"{field}[{i}]") for i, v in enumerate(value)]


def _int_list(value: Any, field: str) -> list[int]:
    value = _maybe_json(value)
    if not isinstance(value, list):
        raise InvalidInput(f"{field}: expected a list of integers, got {value!r}")
    return [_to_int(v, f"{field}[{i}]") for i, v in enumerate(value)]


def _stop(value: Any, field: str) -> str | list[str]:
    value = _maybe_json(value)
    if isinstance(value, str):
        return value
    return _str_list(value, field)


def _logit_bias(value: Any, field: str) -> dict[int, float]:
    value = _maybe_json(value)
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected an object of token id -> bias, got {value!r}")
    return {_to_int(k, f"{field} key"): _to_float(v, f"{field}[{k}]") for k, v in value.items()}


def _structured(value: Any, field: str) -> dict[str, Any]:
    value = _maybe_json(value)
    if not isinstance(value, dict):
        raise InvalidInput(f"{field}: expected an object (json, regex, choice, grammar, ...), got {value!r}")
    return value


@dataclass(frozen=True)
class Rule:
    parse: Callable[[Any, str], Any]
    check: Callable[[Any], bool] | None = None
    rule: str = ""


def _rule(parse: Callable[[Any, str], Any], check: Callable[[Any], bool] | None = None, rule: str = "") -> Rule:
    return Rule(parse, check, rule)


_BOOL = _rule(parse_bool)

# Keys are vLLM SamplingParams fields (a test checks that), plus `lora_name` and the legacy `guided_decoding`.
SAMPLING_RULES: dict[str, Rule] = {
    "n": _rule(_to_int, lambda v: v >= 1, "must be >= 1"),
    "presence_penalty": _rule(_to_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "frequency_penalty": _rule(_to_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "repetition_penalty": _rule(_to_float, lambda v: v > 0.0, "must be > 0"),
    "temperature": _rule(_to_float, lambda v: v >= 0.0, "must be >= 0"),
    "top_p": _rule(_to_float, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    "top_k": _rule(_to_int, lambda v: v >= -1, "must be -1 or 0 (disabled) or a positive integer"),
    "min_p": _rule(_to_float, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    "seed": _rule(_to_int),
    "stop": _rule(_stop),
    "stop_token_ids": _rule(_int_list, lambda v: all(t >= 0 for t in v), "token ids must be >= 0"),
    "bad_words": _rule(_str_list),
    "ignore_eos": _BOOL,
    "max_tokens": _rule(_to_int, lambda v: v >= 1, "must be >= 1"),
    "min_tokens": _rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "logprobs": _rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "prompt_logprobs": _rule(_to_int, lambda v: v >= 0, "must be >= 0"),
    "skip_special_tokens": _BOOL,
    "spaces_between_special_tokens": _BOOL,
    "include_stop_str_in_output": _BOOL,
    "logit_bias": _rule(_logit_bias),
    "allowed_token_ids": _rule(_int_list, lambda v: len(v) > 0, "must not be empty"),
    "structured_outputs": _rule(_structured),
    "guided_decoding": _rule(_structured),
    "lora_name": _rule(_to_str),
}


def _parse_tensor_json(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"sampling_parameters: invalid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"sampling_parameters: expected a JSON object, got {type(doc).__name__}")
    return doc


def validate_sampling(
    tensor_json: str | None,
    request_parameters: Mapping[str, Any],
    *,
    max_logprobs: int | None = None,
    known_loras: frozenset[str] | None = None,
) -> dict[str, Any]:
    """Merge the JSON tensor over the request parameters (the tensor wins per key) and check every value."""
    merged: dict[str, Any] = {
        k: v
        for k, v in request_parameters.items()
        if k not in TRITON_REQUEST_PARAMETERS and not k.startswith("triton_")
    }
    if tensor_json is not None:
        merged.update(_parse_tensor_json(tensor_json))

    checked: dict[str, Any] = {}
    for key, raw in merged.items():
        rule = SAMPLING_RULES.get(key)
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
        guided = checked.pop("guided_decoding")
        checked.setdefault("structured_outputs", {k: v for k, v in guided.items() if k != "backend"})
    if "min_tokens" in checked and "max_tokens" in checked and checked["min_tokens"] > checked["max_tokens"]:
        raise InvalidInput(f"min_tokens={checked['min_tokens']} must be <= max_tokens={checked['max_tokens']}")
    if max_logprobs is not None:
        for key in ("logprobs", "prompt_logprobs"):
            if checked.get(key, 0) > max_logprobs:
                raise InvalidInput(f"{key}={checked[key]}: must be <= {max_logprobs} (the engine's max_logprobs)")
    lora = checked.get("lora_name")
    if lora is not None and known_loras is not None and lora not in known_loras:
        known = ", ".join(sorted(known_loras)) or "none"
        raise InvalidInput(f"lora_name={lora!r}: not an adapter of this deployment (known: {known})")
    return checked
