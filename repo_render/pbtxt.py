"""config.pbtxt: Triton's model configuration in protobuf text format."""

from __future__ import annotations

import json
from typing import Any

from core.interface import TensorSpec

HEADER = "# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.\n"


class Enum(str):
    """A protobuf enum value: written without quotes."""


def _pbtxt_value(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """Protobuf text format for a dict; list values of dicts become repeated fields."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{pbtxt(value, indent + 1)}{pad}}}\n")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines.append(f"{pad}{key} {{\n{pbtxt(item, indent + 1)}{pad}}}\n")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_pbtxt_value(v) for v in value)} ]\n")
        else:
            lines.append(f"{pad}{key}: {_pbtxt_value(value)}\n")
    return "".join(lines)


def _tensor(spec: TensorSpec, optional: bool | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec.name, "data_type": Enum(spec.data_type), "dims": list(spec.dims)}
    if spec.optional if optional is None else optional:
        entry["optional"] = True
    return entry


def _parameters(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"string_value": v}} for k, v in values.items()]


def _python_model(
    name: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    instances: int,
    kind: str,
    decoupled: bool = False,
    parameters: dict[str, str] | None = None,
    preserve_ordering: bool = False,
) -> str:
    config: dict[str, Any] = {
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "input": [_tensor(t) for t in inputs],
        "output": [_tensor(t, optional=False) for t in outputs],
        "instance_group": [{"count": instances, "kind": Enum(kind)}],
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    if preserve_ordering:
        config["dynamic_batching"] = {"preserve_ordering": True}
    if parameters:
        config["parameters"] = _parameters(parameters)
    return HEADER + pbtxt(config)


def _ensemble(
    name: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], steps: list[dict[str, Any]]
) -> str:
    config = {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": [_tensor(t) for t in inputs],
        "output": [_tensor(t, optional=False) for t in outputs],
        "ensemble_scheduling": {"step": steps},
    }
    return HEADER + pbtxt(config)


def _step(model: str, input_map: dict[str, str], output_map: dict[str, str]) -> dict[str, Any]:
    return {
        "model_name": model,
        "model_version": -1,
        "input_map": [{"key": k, "value": v} for k, v in input_map.items()],
        "output_map": [{"key": k, "value": v} for k, v in output_map.items()],
    }
