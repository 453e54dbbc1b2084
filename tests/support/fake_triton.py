"""The Triton adapters (core/adapters/) outside a Triton stub: a stand-in for the stub's own module
(`triton_python_backend_utils`, which only Triton's stubs have) that records what an adapter builds, and a stand-in
for the core's vLLM engine. Unit tests of the adapters' own logic; the real thing is tested against a real server."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from core.protocol import EngineResponse, SequenceDelta
from core.warm_up import WARM_UP_PROMPT, WARM_UP_SAMPLING

FINAL_FLAG = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class FakeEngine:
    """core.engine.Engine's surface that the core's adapter calls; records its construction and aborts."""

    created: list[dict[str, Any]] = []

    def __init__(self, engine_args: dict[str, Any], **kwargs: Any) -> None:
        self.created.append({"engine_args": engine_args, **kwargs})
        self.cancelled: list[str] = []
        self.submitted: list[Any] = []  # the EngineRequests, in order
        self.warm_ups: list[Any] = []  # the core's own warm-up requests (core/warm_up.py), answered at once

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def submit(self, request: Any, emit: Any, cancelled: Any, key: str = "") -> str:
        if request.prompt_token_ids == list(WARM_UP_PROMPT) and request.sampling == WARM_UP_SAMPLING:
            self.warm_ups.append(request)
            delta = SequenceDelta(index=0, text="", token_ids=[0, 0], finish_reason="length")
            emit(EngineResponse(outputs=[delta], num_input_tokens=len(WARM_UP_PROMPT), finished=True), None, True)
            return "warm-up"
        self.submitted.append(request)
        return f"triton-{len(self.submitted)}"


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self.output_tensors = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class TritonError:
    INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.message, self.code = message, code


class RecordingSender:
    """A request's response sender: keeps (response, flags) of every send."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, int]] = []

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        self.sent.append((response, flags))

    def is_cancelled(self) -> bool:
        return False


class Request:
    """A Triton request as an adapter reads it: its input arrays, parameters and the outputs its caller wants."""

    def __init__(
        self, inputs: dict[str, np.ndarray], parameters: dict[str, Any] | None = None, requested: tuple[str, ...] = ()
    ) -> None:
        self._inputs, self._parameters, self._requested = inputs, parameters or {}, list(requested)
        self.sender = RecordingSender()

    def inputs(self) -> list[Tensor]:
        """New objects on every call, as the stub's (each call builds them anew)."""
        return [Tensor(name, array) for name, array in self._inputs.items()]

    def get_response_sender(self) -> RecordingSender:
        return self.sender

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return self._requested


def get_input_tensor_by_name(request: Request, name: str) -> Tensor | None:
    """As triton_python_backend_utils' own: the first of the request's inputs with that name."""
    return next((tensor for tensor in request.inputs() if tensor.name() == name), None)


def fake_stub_module() -> types.ModuleType:
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Logger = types.SimpleNamespace(log_info=print, log_warn=print, log_error=print)
    stub.Tensor, stub.InferenceResponse, stub.TritonError = Tensor, InferenceResponse, TritonError
    stub.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL_FLAG
    stub.get_input_tensor_by_name = get_input_tensor_by_name
    return stub


def adapters_with_fake_stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """core.triton_models imported afresh against the fake stub module, the core's Engine replaced by FakeEngine."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_stub_module())
    adapters = [name for name in sys.modules if name == "core.triton_models" or name.startswith("core.adapters")]
    for name in adapters:
        monkeypatch.delitem(sys.modules, name)
    import core.adapters.core_model as core_model
    import core.triton_models as module

    monkeypatch.setattr(core_model, "Engine", FakeEngine)
    monkeypatch.setattr(core_model, "prepare_process_environment", lambda: None)
    yield module
    for name in [name for name in sys.modules if name == "core.triton_models" or name.startswith("core.adapters")]:
        monkeypatch.delitem(sys.modules, name, raising=False)
