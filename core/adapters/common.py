"""What every Triton adapter shares: the files and request parameters between models, error mapping, the guarded
response sender."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from core.engine_config import resolve_path, resolve_paths
from core.interface import ENGINE_RESPONSE, InvalidInput, TensorSpec, Unavailable
from core.interface import document_tensor as interface_document_tensor
from core.protocol import peek_response
from core.stage import load_stage_class

LORA_FILE = "multi_lora.json"
STAGE_PATH_KEYS = ("tokenizer", "chat_template_file")
# Request parameters between an entry model and the core (docs/platform-notes.md T5: on Triton 2.51 a client's cancel
# does not reach a BLS child, so the entry model, which does see it, aborts its core request by key).
CANCEL_KEY_PARAMETER = "cancel_key"
ABORT_PARAMETER = "abort"
CODE_TAG_PARAMETER = "tag_error_codes"  # a BLS caller asks the core to tag error codes into messages


def version_dir(args: dict[str, Any]) -> Path:
    return Path(args["model_repository"]) / args["model_version"]


def triton_error(exc: BaseException, tagged: bool = False) -> Any:
    for kind, code in ((InvalidInput, "INVALID_ARG"), (Unavailable, "UNAVAILABLE")):
        if isinstance(exc, kind):
            message = f"[{code}] {exc}" if tagged else str(exc)
            return pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    return pb_utils.TritonError(f"internal error: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)


def child_error(error: Any) -> Any:
    """A BLS child's error for our own client, with its code: measured on 2.51, a BLS response's error comes
    back as INTERNAL whatever code the child set, so the core tags the code into the message for BLS callers."""
    message, code = error.message(), error.code()
    for name in ("INVALID_ARG", "UNAVAILABLE"):
        tag = f"[{name}] "
        if message.startswith(tag):
            message, code = message[len(tag) :], getattr(pb_utils.TritonError, name)
    return pb_utils.TritonError(message, code)


def request_parameters(request: Any) -> dict[str, Any]:
    raw = request.parameters()
    return json.loads(raw) if raw else {}


def document_tensor(spec: TensorSpec, document: str | bytes) -> Any:
    """ENGINE_REQUEST or ENGINE_RESPONSE as a Triton tensor, in the shape the rendered configs declare."""
    return pb_utils.Tensor(spec.name, interface_document_tensor(spec, document))


class CoreResponses:
    """The core's responses to one BLS request, read to the end: each as its ENGINE_RESPONSE array, still encoded
    (the caller decodes only what it needs: core/protocol.py's whole_answer, peek_response). A response with an
    error (a Triton error, or the core's in-band one: EngineResponse.error) is not yielded but kept in `error` (the
    last one), and reading goes on, so the iterator is drained either way before the caller releases it."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator
        self.error: Any = None
        self.finished = False  # the last yielded response's header: it ended the request

    def __iter__(self) -> Iterator[np.ndarray]:
        for child_response in self.iterator:
            if child_response.has_error():
                self.error = child_response.error()
                continue
            tensor = pb_utils.get_output_tensor_by_name(child_response, ENGINE_RESPONSE.name)
            if tensor is None:
                continue
            array = tensor.as_numpy()
            header = peek_response(array.reshape(-1)[0])
            if header.error is not None:
                self.error = pb_utils.TritonError(header.error)
                continue
            self.finished = header.finished
            yield array


class GuardedSender:
    """A response sender whose `is_cancelled()` is safe to call from any thread at any time.

    Measured on Triton 2.51: `is_cancelled()` on a sender whose FINAL response was already sent reaches
    TRITONBACKEND_ResponseFactoryIsCancelled on a freed factory and kills the server (SIGSEGV). Cancel
    watchers poll from other threads, so sending FINAL and probing are serialised here, and a closed sender
    answers True without asking Triton.
    """

    def __init__(self, sender: Any) -> None:
        self._sender = sender
        self._lock = threading.Lock()
        self.closed = False
        self.tagged = False  # the caller is a BLS model: error codes go into the message (see child_error)

    def send(self, response: Any = None, flags: int = 0) -> None:
        with self._lock:
            if self.closed:
                return
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.closed = True
            self._sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        with self._lock:
            return self.closed or self._sender.is_cancelled()


def lora_adapters(lora_file: Path, repository_root: Path) -> dict[str, str]:
    """multi_lora.json, name -> adapter path, with the same path rule as model.json; every local adapter must
    exist now: vLLM loads an adapter at its first request, and a missing one kills the EngineCore for everyone."""
    if not lora_file.exists():
        return {}
    names = json.loads(lora_file.read_text(encoding="utf-8"))
    adapters = resolve_paths(names, repository_root, tuple(names))
    for name, path in adapters.items():
        if Path(path).is_absolute() and not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"{lora_file}: LoRA adapter {name!r}: no adapter_config.json in {path}")
    return adapters


def load_stage_from_spec(spec: dict[str, Any], repository_root: Path) -> type:
    """A stage.json entry's class, imported with its code_paths (relative ones start at the repository root, like
    model.json's paths)."""
    folders = [resolve_path(p, repository_root) for p in spec.get("code_paths", [])]
    return load_stage_class(spec["class"], folders)


class LoadedStage:
    """A stage (core/stage.py) built from its stage.json entry, run on Triton tensors: the stage models, the entry
    models and the core (core.preprocess_threads, core.postprocess_in_sender) all run their stages through
    this."""

    def __init__(self, spec: dict[str, Any], repository_root: Path) -> None:
        stage_class = load_stage_from_spec(spec, repository_root)
        self.stage = stage_class(resolve_paths(spec.get("settings", {}), repository_root, STAGE_PATH_KEYS))
        self.input_names = [t.name for t in stage_class.inputs]
        self.output_types = {t.name: t.numpy_dtype for t in stage_class.outputs}

    def inputs_of(self, request: Any) -> dict[str, np.ndarray]:
        """The stage's inputs that a Triton request carries. One `inputs()` call: each builds every input's Python
        object anew, and pb_utils.get_input_tensor_by_name calls it once per name (a dozen names here, each call in
        the stub's main thread while a burst of requests waits for it)."""
        tensors = {tensor.name(): tensor for tensor in request.inputs()}
        return {name: tensors[name].as_numpy() for name in self.input_names if name in tensors}

    def run_numpy(self, inputs: dict[str, Any], parameters: dict[str, Any]) -> dict[str, np.ndarray]:
        """The stage's outputs as arrays of the types its config declares."""
        outputs = self.stage.process(inputs, parameters)
        types = self.output_types
        return {name: np.asarray(value, dtype=types[name]) for name, value in outputs.items()}

    def run(self, inputs: dict[str, Any], parameters: dict[str, Any]) -> list[Any]:
        """The stage's outputs as Triton tensors."""
        return [pb_utils.Tensor(name, value) for name, value in self.run_numpy(inputs, parameters).items()]
