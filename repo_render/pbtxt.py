"""config.pbtxt: Triton's model configuration in protobuf text format."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from core.interface import TensorSpec

HEADER = "# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.\n"


def pbtxt(config: dict[str, Any]) -> str:
    """A ModelConfig, given as a dict in its protobuf field names, in protobuf text format. Going through
    tritonclient's model_config_pb2 checks every field name and enum value here, at render time, not when
    Triton loads the file; repeated fields are lists, map fields (input_map, output_map) dicts."""
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    return text_format.MessageToString(message)


def _tensor(spec: TensorSpec, optional: bool | None = None, batched: bool = False) -> dict[str, Any]:
    # A batching model's config leaves out the batch dimension (the spec's first) that Triton adds itself.
    dims = list(spec.dims[1:] if batched else spec.dims)
    entry: dict[str, Any] = {"name": spec.name, "data_type": spec.data_type, "dims": dims}
    if spec.optional if optional is None else optional:
        entry["optional"] = True
    return entry


def _python_model(
    name: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    instances: int,
    kind: str,
    decoupled: bool = False,
    preserve_ordering: bool = False,
    max_batch_size: int = 0,
) -> str:
    """`max_batch_size` > 0: Triton's dynamic batcher hands the model every queued request (up to that many) in
    one `execute`, without delay; the tensors' first dimension is the batch dimension."""
    batched = max_batch_size > 0
    config: dict[str, Any] = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [_tensor(t, batched=batched) for t in inputs],
        "output": [_tensor(t, optional=False, batched=batched) for t in outputs],
        "instance_group": [{"count": instances, "kind": kind}],
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    if preserve_ordering or batched:
        config["dynamic_batching"] = {"preserve_ordering": True} if preserve_ordering else {}
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
        "input_map": input_map,
        "output_map": output_map,
    }
