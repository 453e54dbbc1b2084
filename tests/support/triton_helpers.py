"""Client helpers for the tests: the same request over gRPC, HTTP /infer, /generate and the two streams."""

from __future__ import annotations

import json
import os
import queue
from typing import Any

import numpy as np
import requests

from tools.triton_server import process_table

PLAIN_MODEL = "vllm_model"
STREAM_MODEL = "vllm_model_stream"

# Some prompts with multi-byte characters: the tiny model's tokenizer was trained on such text.
REFERENCE_PROMPTS = [
    "The quick brown fox",
    "Grüße aus München und",
    "你好，世界！今天",
    "def handle(request):",
    "Once upon a time, a small robot",
    "Emoji also appear in chats: 😀",
]
REFERENCE_MAX_TOKENS = 32
GREEDY = {"temperature": 0, "max_tokens": REFERENCE_MAX_TOKENS}


def _arrays(text: str, sampling: dict | None, flags: dict[str, bool]) -> list[tuple[str, np.ndarray, str]]:
    arrays = [("text_input", np.array([text.encode("utf-8")], dtype=np.object_), "BYTES")]
    if sampling is not None:
        arrays.append(("sampling_parameters", np.array([json.dumps(sampling).encode()], dtype=np.object_), "BYTES"))
    for name, value in flags.items():
        arrays.append((name, np.array([value], dtype=np.bool_), "BOOL"))
    return arrays


def grpc_inputs(text: str, sampling: dict | None = None, **flags: bool) -> list[Any]:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array, dtype in _arrays(text, sampling, flags):
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def http_inputs(text: str, sampling: dict | None = None, **flags: bool) -> list[Any]:
    import tritonclient.http as httpclient

    inputs = []
    for name, array, dtype in _arrays(text, sampling, flags):
        tensor = httpclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array, binary_data=False)
        inputs.append(tensor)
    return inputs


OUTPUT_NAMES = (
    "text_output",
    "finish_reason",
    "cumulative_logprob",
    "logprobs",
    "num_input_tokens",
    "num_output_tokens",
    "prompt_logprobs",
    "stop_reason",
)


def outputs_of(result: Any) -> dict[str, np.ndarray]:
    found = {}
    for name in OUTPUT_NAMES:
        value = result.as_numpy(name)
        if value is not None:
            found[name] = value
    return found


def text_of(outputs: dict[str, np.ndarray], index: int = 0) -> str:
    value = outputs["text_output"].reshape(-1)[index]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def grpc_infer(client: Any, text: str, sampling: dict | None = None, model: str = PLAIN_MODEL, **flags: bool):
    return outputs_of(client.infer(model, grpc_inputs(text, sampling, **flags)))


def http_infer(client: Any, text: str, sampling: dict | None = None, model: str = PLAIN_MODEL, **flags: bool):
    return outputs_of(client.infer(model, http_inputs(text, sampling, **flags)))


def http_generate(url: str, payload: dict, model: str = PLAIN_MODEL) -> requests.Response:
    return requests.post(f"http://{url}/v2/models/{model}/generate", json=payload, timeout=120)


def sse_events(url: str, payload: dict, model: str = STREAM_MODEL) -> list[dict]:
    events = []
    with requests.post(
        f"http://{url}/v2/models/{model}/generate_stream", json=payload, stream=True, timeout=120
    ) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines(decode_unicode=False):
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: ") :]))
    return events


def grpc_stream(url: str, inputs: list[Any], model: str = STREAM_MODEL, timeout: float = 120):
    """[(outputs, is_final)] for one streamed request, using an empty-final-aware stream."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, request_id="stream-1", enable_empty_final_response=True)
        received = []
        while True:
            result, error = results.get(timeout=timeout)
            if error is not None:
                raise error
            final = result.get_response().parameters["triton_final_response"].bool_param
            received.append((outputs_of(result), final))
            if final:
                return received
    finally:
        client.stop_stream()
        client.close()


def process_group_members(pgid: int) -> dict[int, str]:
    """pid -> command name of every live process in a process group (the server, its stubs, EngineCore)."""
    return {pid: p.comm for pid, p in process_table().items() if p.pgid == pgid and p.state != "Z"}


def stub_pids(pgid: int) -> set[int]:
    return {pid for pid, comm in process_group_members(pgid).items() if comm.startswith("triton_python")}


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))
