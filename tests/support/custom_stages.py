"""Stage classes a deployment can point at by import path (`tests.support.custom_stages:Class`).

`ShoutingPostprocessor` is served for real by tests/integration/test_deployments.py; the others are each wrong in
one way the renderer must refuse (tests/unit/test_render.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.interface import TensorSpec
from core.stage import Stage
from postprocess.vllm_backend import VllmBackendPostprocessor


class ShoutingPostprocessor(VllmBackendPostprocessor):
    """The vLLM-backend outputs, with the text upper-cased and a configurable prefix."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.prefix = str(settings.get("prefix", ""))

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        out = super().process(inputs, parameters)
        out["text_output"] = np.array(
            [(self.prefix + bytes(t).decode("utf-8").upper()).encode("utf-8") for t in out["text_output"]],
            dtype=np.object_,
        )
        return out


class _Base(Stage):
    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {}


class NoEngineRequest(_Base):
    inputs = (tensors.TEXT_INPUT,)
    outputs = (TensorSpec("prompt_ids", "TYPE_INT32", (-1,)),)


class EngineRequestAsInts(_Base):
    inputs = (tensors.TEXT_INPUT,)
    outputs = (TensorSpec("engine_request", "TYPE_INT32", (-1,)),)


class ExtraOutput(_Base):
    inputs = (tensors.TEXT_INPUT,)
    outputs = (tensors.ENGINE_REQUEST, TensorSpec("stream_flag", "TYPE_BOOL", (1,)))


class NeedsRequestInput(_Base):
    """Needs `stream` from the request after the decoupled core: Triton would refuse the streaming ensemble."""

    inputs = (tensors.ENGINE_RESPONSE, TensorSpec("stream", "TYPE_BOOL", (1,)))
    outputs = (tensors.TEXT_OUTPUT,)


class EngineResponseAsFloat(_Base):
    inputs = (TensorSpec("engine_response", "TYPE_FP32", (1,)),)
    outputs = (tensors.TEXT_OUTPUT,)


class EchoesAnInput(_Base):
    inputs = (tensors.ENGINE_RESPONSE,)
    outputs = (tensors.TEXT_INPUT,)


class Decoupled(_Base):
    decoupled = True
    inputs = (tensors.ENGINE_RESPONSE,)
    outputs = (tensors.TEXT_OUTPUT,)


class TwiceTheSameOutput(_Base):
    inputs = (tensors.ENGINE_RESPONSE,)
    outputs = (tensors.TEXT_OUTPUT, tensors.TEXT_OUTPUT)


class UnknownDataType(_Base):
    inputs = (tensors.ENGINE_RESPONSE,)
    outputs = (TensorSpec("score", "TYPE_FP64", (1,)),)


class NoOutputs(_Base):
    inputs = (tensors.ENGINE_RESPONSE,)
    outputs = ()


class NotSpecs(_Base):
    inputs = ("engine_response",)
    outputs = (tensors.TEXT_OUTPUT,)
