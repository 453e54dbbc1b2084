"""The tensor interface, declared once.

`tools/render_repo.py` writes every `config.pbtxt` from these declarations (each stage class lists which of
them it consumes and produces), and the Triton adapters read the names from the rendered config. Nothing else
spells a tensor's type or shape.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton config type, e.g. "TYPE_STRING"
    dims: tuple[int, ...]
    optional: bool = False
    doc: str = ""

    @property
    def numpy_dtype(self) -> type:
        return NUMPY_DTYPES[self.data_type]


NUMPY_DTYPES: dict[str, type] = {
    "TYPE_STRING": np.object_,
    "TYPE_BOOL": np.bool_,
    "TYPE_FP32": np.float32,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_UINT32": np.uint32,
}


class InvalidInput(ValueError):
    """A request the client must fix. Adapters turn it into Triton's INVALID_ARG with this message."""


class Unavailable(RuntimeError):
    """The server cannot serve the request now (engine dead, shutting down). Adapters answer UNAVAILABLE."""


# Error texts of the Triton vLLM backend, verbatim: its clients and its CI match them (a message starts with
# the backend's text; ours may follow). Inside an ensemble, Triton puts "in ensemble '<name>', " before them.
STREAM_ECHO_ERROR = "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed."


def stream_echo_error() -> InvalidInput:
    return InvalidInput(
        f"{STREAM_ECHO_ERROR} exclude_input_in_output=false with stream=true: leave it unset or send true"
    )


def check_lora(name: str | None, served: Collection[str] | None) -> None:
    """A request's `lora_name` against the adapters served (None: not known here, the core checks), with the
    backend's two errors: no adapters served at all, or an adapter it does not serve. Preprocess checks early,
    the core checks again (a deployment's own preprocess may not)."""
    if name is None or served is None or name in served:
        return
    if not served:
        raise InvalidInput(f"LoRA feature is not enabled. lora_name={name!r}: this deployment serves no LoRA adapters")
    # The backend prints its Python list of names: ['adapter1', 'adapter2']
    raise InvalidInput(f"LoRA {name} is not supported, we currently support {sorted(served)} (lora_name={name!r})")


def _bool(name: str, doc: str) -> TensorSpec:
    return TensorSpec(name, "TYPE_BOOL", (1,), optional=True, doc=doc)


# Public inputs: the Triton vLLM backend's tensors (clients written for it work unchanged), plus chat messages.
TEXT_INPUT = TensorSpec("text_input", "TYPE_STRING", (1,), optional=True, doc="the prompt")
MESSAGES = TensorSpec(
    "messages", "TYPE_STRING", (1,), optional=True, doc="OpenAI-style chat messages (JSON), instead of text_input"
)
IMAGE = TensorSpec("image", "TYPE_STRING", (-1,), optional=True, doc="base64 images, one per element")
CHAT_OPTIONS = TensorSpec(
    "chat_options",
    "TYPE_STRING",
    (1,),
    optional=True,
    doc="chat template options (JSON object): chat_template_kwargs, add_generation_prompt, ...",
)
STREAM = _bool("stream", "stream deltas (streaming model) instead of one final response")
SAMPLING_PARAMETERS = TensorSpec(
    "sampling_parameters", "TYPE_STRING", (1,), optional=True, doc="vLLM sampling parameters (JSON object)"
)
EXCLUDE_INPUT_IN_OUTPUT = _bool("exclude_input_in_output", "do not prepend the prompt to a non-streamed output")
RETURN_FINISH_REASON = _bool("return_finish_reason", "add finish_reason")
RETURN_CUMULATIVE_LOGPROB = _bool("return_cumulative_logprob", "add cumulative_logprob")
RETURN_LOGPROBS = _bool("return_logprobs", "add logprobs")
RETURN_NUM_INPUT_TOKENS = _bool("return_num_input_tokens", "add num_input_tokens")
RETURN_NUM_OUTPUT_TOKENS = _bool("return_num_output_tokens", "add num_output_tokens")
RETURN_STOP_REASON = _bool("return_stop_reason", "add stop_reason (ours)")

RETURN_FLAGS = (
    RETURN_FINISH_REASON,
    RETURN_CUMULATIVE_LOGPROB,
    RETURN_LOGPROBS,
    RETURN_NUM_INPUT_TOKENS,
    RETURN_NUM_OUTPUT_TOKENS,
    RETURN_STOP_REASON,
)

# Public outputs, with the vLLM backend's names, types and shapes (one element per sequence when n > 1).
TEXT_OUTPUT = TensorSpec("text_output", "TYPE_STRING", (-1,))
FINISH_REASON = TensorSpec("finish_reason", "TYPE_STRING", (-1,))
CUMULATIVE_LOGPROB = TensorSpec("cumulative_logprob", "TYPE_FP32", (-1,))
LOGPROBS = TensorSpec("logprobs", "TYPE_STRING", (-1,))
NUM_INPUT_TOKENS = TensorSpec("num_input_tokens", "TYPE_UINT32", (1,))
NUM_OUTPUT_TOKENS = TensorSpec("num_output_tokens", "TYPE_UINT32", (-1,))

# The OpenAI-style postprocess's one output: a `chat.completion` (whole answer) or `chat.completion.chunk`
# (one streamed delta) JSON document.
CHAT_COMPLETION = TensorSpec("chat_completion", "TYPE_STRING", (1,), doc="OpenAI chat.completion(.chunk) JSON")
# Ours: vLLM's stop reason per sequence: the stop string, the stop token id, or "None" (EOS, length, unfinished).
STOP_REASON = TensorSpec("stop_reason", "TYPE_STRING", (-1,))
# Ours: prompt logprobs (sampling parameter `prompt_logprobs`), in the `logprobs` JSON style, first entry null.
PROMPT_LOGPROBS = TensorSpec("prompt_logprobs", "TYPE_STRING", (1,))

VLLM_BACKEND_OUTPUTS = (TEXT_OUTPUT, FINISH_REASON, CUMULATIVE_LOGPROB, LOGPROBS, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS)

# Internal tensors between the stages. Each is one document, a typed msgspec Struct (core/protocol.py): a request
# or a response carries few, heterogeneous fields, and postprocess must get its per-request options through the core
# (a step after a decoupled step may only consume that step's outputs, docs/platform-notes.md T2).
# Shape [1, 1]: the first dimension is the batch dimension of the core and generate. They batch (max_batch_size > 0,
# dims [1]) so that requests arriving together enter them in one `execute`, one round trip between tritonserver and
# a stub instead of one each (docs/performance-gpu.md); the stages around them do not batch and see [1, 1].
ENGINE_REQUEST = TensorSpec("engine_request", "TYPE_STRING", (1, 1), doc="validated engine request (JSON)")
ENGINE_RESPONSE = TensorSpec("engine_response", "TYPE_STRING", (1, 1), doc="one engine delta or final (MessagePack)")


def document_tensor(spec: TensorSpec, document: str | bytes) -> np.ndarray:
    """One document (ENGINE_REQUEST, ENGINE_RESPONSE) as the array of `spec`'s shape that carries it."""
    data = document.encode("utf-8") if isinstance(document, str) else document
    return np.array([data], dtype=np.object_).reshape(spec.dims)
