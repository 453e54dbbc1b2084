"""The CPU-runnable example deployments and a deployment's own stage, served by one real tritonserver (real
Python backend, real vLLM CPU engines: one per deployment) answering real requests.

The tiny default example renders the checked-in repository (tests/unit/test_examples.py), which the session server
of tests/integration/test_server.py serves; tests/integration/test_vision.py serves the vision-language example; the
GPU examples are rendered only.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import requests

from core.cpu_placement import is_engine_process, process_tree
from repo_render import ROOT, load_deployment
from tests.support.deployment_helpers import render_together, start_server, with_own_internal_names
from tests.support.triton_helpers import grpc_infer, grpc_inputs, grpc_stream, http_generate, sse_events
from tools.build_tiny_lora import build as build_tiny_lora

EXAMPLES = ROOT / "deployments" / "examples"
PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_tokens": 16}

pytestmark = pytest.mark.server  # every test here asks the module's own tritonserver

CUSTOM_DEPLOYMENT = """
model: {model}
engine_args: {{enforce_eager: true, max_model_len: 512, kv_cache_memory_bytes: 268435456, gpu_memory_utilization: 0.05,
  disable_log_stats: true}}
preprocess: {{class: raw}}
postprocess:
  class: tests.support.custom_stages:ShoutingPostprocessor    # the deployment's own stage, by import path
  settings: {{prefix: "[grüße] "}}                       # non-ASCII: the stub reads stage.json as ASCII
names: {{plain: custom_model, streaming: custom_model_stream}}
# every engine of this server on CPU 1, the rest on 0; the streaming ensemble is the core alone: it runs the raw
# preprocess on two threads of its own and the postprocess (the stage above) in its sender threads (two: one stage
# object used by both at once)
core: {{engine_cpus: [1], preprocess_threads: 2, postprocess_in_sender: true, sender_threads: 2}}
# the plain public model is an entry model: the raw preprocess and the stage above in-process, the core by BLS
entry: plain-bls
"""


@pytest.fixture(scope="module")
def examples_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    build_tiny_lora()
    workdir = tmp_path_factory.mktemp("deployments")
    custom = workdir / "custom.yaml"
    custom.write_text(CUSTOM_DEPLOYMENT.format(model=tiny_model))
    deployments = [
        with_own_internal_names(load_deployment(path))
        for path in (EXAMPLES / "multi-lora.yaml", EXAMPLES / "openai.yaml", custom)
    ]
    repository = workdir / "repository"
    render_together(deployments, repository)
    server = start_server(repository, workdir / "tritonserver.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def base_text(examples_server) -> str:
    """The tiny model's greedy continuation, without an adapter, through the multi-LoRA deployment."""
    reply = http_generate(examples_server.http_url, {"text_input": PROMPT, "parameters": GREEDY}, model="lora_model")
    assert reply.status_code == 200, reply.text
    text = reply.json()["text_output"]
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    return text[len(PROMPT) :]


def test_custom_stage_by_import_path_serves_requests(examples_server, base_text):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(examples_server.grpc_url)
    try:
        outputs = grpc_infer(client, PROMPT, GREEDY, model="custom_model", exclude_input_in_output=True)
    finally:
        client.close()
    # The raw preprocess sends the prompt as text (vLLM tokenizes it): same tokens, same greedy continuation.
    assert outputs["text_output"][0].decode() == "[grüße] " + base_text.upper()


def test_the_plain_entry_serves_plain_infer_with_the_deployments_own_stage(examples_server, base_text):
    """entry: plain-bls: the plain model is one Python model running both stages (no generate, no stage models: the
    streaming ensemble is the core alone here); HTTP /infer through it gives the same text as gRPC and /generate."""
    repository = examples_server.model_repository
    config = (repository / "custom_model" / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "ensemble_scheduling" not in config
    assert not any((repository / f"custom_model_{m}").exists() for m in ("generate", "preprocess", "postprocess"))
    payload = {
        "inputs": [
            {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [PROMPT]},
            {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES", "data": [json.dumps(GREEDY)]},
            {"name": "exclude_input_in_output", "shape": [1], "datatype": "BOOL", "data": [True]},
        ]
    }
    url = f"http://{examples_server.http_url}/v2/models/custom_model/infer"
    reply = requests.post(url, json=payload, timeout=60)
    assert reply.status_code == 200, reply.text
    (text,) = [o["data"][0] for o in reply.json()["outputs"] if o["name"] == "text_output"]
    assert text == "[grüße] " + base_text.upper()
    bad = {"inputs": [*payload["inputs"][:1], {**payload["inputs"][1], "data": ['{"temperature": -1}']}]}
    refused = requests.post(url, json=bad, timeout=60)
    assert refused.status_code == 400 and "temperature" in refused.text, refused.text


SHOUT = "[grüße] "


def _shouted_deltas(deltas: list[str]) -> str:
    """The custom stage's streamed text: every delta its own prefix + the delta upper-cased."""
    assert deltas and all(delta.startswith(SHOUT) for delta in deltas), deltas
    return "".join(delta[len(SHOUT) :] for delta in deltas)


def _stream_custom(url: str, prompt: str, **flags: bool) -> list[tuple[dict, bool]]:
    return grpc_stream(url, grpc_inputs(prompt, GREEDY, stream=True, **flags), "custom_model_stream")


def test_stages_in_the_core_stream_the_deployments_own_stage(examples_server, base_text):
    """core.preprocess_threads and core.postprocess_in_sender: the custom deployment's streaming ensemble is the
    core alone, which preprocesses on its own threads and runs the deployment's own postprocess class (imported by path
    in the core's process) on every delta in its sender."""
    config = (examples_server.model_repository / "custom_model_stream" / "config.pbtxt").read_text()
    assert config.count("step {") == 1 and "custom_model_postprocess" not in config
    assert "custom_model_preprocess" not in config
    flags = {"return_finish_reason": True, "return_num_output_tokens": True}
    received = _stream_custom(examples_server.grpc_url, PROMPT, **flags)
    texts = [outputs["text_output"][0].decode() for outputs, _ in received if "text_output" in outputs]
    assert _shouted_deltas(texts) == base_text.upper()
    assert len(texts) >= 2  # streamed: more than the one final response
    final, is_final = received[-1]
    assert is_final and final["finish_reason"][0].decode() == "length"
    assert sum(int(outputs["num_output_tokens"][0]) for outputs, _ in received) == GREEDY["max_tokens"]
    # The same over HTTP's /generate_stream (SSE)
    payload = {"text_input": PROMPT, "stream": True, "parameters": GREEDY}
    events = sse_events(examples_server.http_url, payload, model="custom_model_stream")
    assert _shouted_deltas([event["text_output"] for event in events]) == base_text.upper()


def test_stages_in_the_core_keep_each_streams_order_under_concurrency(examples_server, base_text):
    """Eight streams at once through the core's two sender threads (a request stays on one thread; the stage object
    is shared by both): each arrives whole and in order, the same as the plain path's answer."""
    prompts = [f"{PROMPT} {i}" for i in range(8)]
    client_replies = {
        p: http_generate(examples_server.http_url, {"text_input": p, "parameters": GREEDY}, model="custom_model")
        for p in prompts
    }
    with ThreadPoolExecutor(len(prompts)) as pool:
        streamed = dict(zip(prompts, pool.map(partial(_stream_custom, examples_server.grpc_url), prompts), strict=True))
    for prompt in prompts:
        plain = client_replies[prompt].json()["text_output"]  # echoes the prompt, shouted
        texts = [outputs["text_output"][0].decode() for outputs, _ in streamed[prompt] if "text_output" in outputs]
        assert plain == SHOUT + (prompt + _shouted_deltas(texts)).upper(), prompt


def test_stages_in_the_core_bad_input_is_a_clear_error_and_the_stream_goes_on(examples_server, base_text):
    """A request refused by the preprocess stage on the core's threads and one refused by vLLM in the core: each
    stream ends with its error (in-band on a gRPC stream: tritonclient gives no status code, so the code is
    asserted over HTTP), and the next stream is served."""
    from tritonclient.utils import InferenceServerException

    url = examples_server.grpc_url
    with pytest.raises(InferenceServerException, match="temperature"):
        grpc_stream(url, grpc_inputs(PROMPT, {"temperature": -1}, stream=True), "custom_model_stream")
    # vLLM's own refusal (the prompt is longer than the context), sent by the core as the step's error
    with pytest.raises(InferenceServerException, match="512"):
        grpc_stream(url, grpc_inputs("fox " * 2000, GREEDY, stream=True), "custom_model_stream")
    for text, sampling, expected in (
        (PROMPT, {"temperature": -1}, "temperature"),
        ("fox " * 2000, GREEDY, "512"),
    ):
        reply = requests.post(
            f"http://{examples_server.http_url}/v2/models/custom_model_stream/generate_stream",
            json={"text_input": text, "stream": True, "parameters": sampling},
            timeout=120,
        )
        assert reply.status_code == 400 and expected in reply.text, reply.text
    received = _stream_custom(url, PROMPT)
    texts = [outputs["text_output"][0].decode() for outputs, _ in received if "text_output" in outputs]
    assert _shouted_deltas(texts) == base_text.upper()


def test_openai_example_answers_with_a_chat_completion(examples_server, base_text):
    reply = http_generate(examples_server.http_url, {"text_input": PROMPT, "parameters": GREEDY}, model="chat_model")
    assert reply.status_code == 200, reply.text
    document = json.loads(reply.json()["chat_completion"])
    assert document["object"] == "chat.completion"
    assert document["model"] == "chat_model" and document["id"].startswith("chatcmpl-")
    (choice,) = document["choices"]
    assert choice["message"] == {"role": "assistant", "content": base_text}  # no prompt echo in OpenAI's API
    assert choice["finish_reason"] == "length"
    usage = document["usage"]
    assert usage["completion_tokens"] == 16 and usage["total_tokens"] == usage["prompt_tokens"] + 16


def test_openai_example_streams_chat_completion_chunks(examples_server, base_text):
    payload = {"text_input": PROMPT, "stream": True, "parameters": GREEDY}
    events = sse_events(examples_server.http_url, payload, model="chat_model_stream")
    chunks = [json.loads(event["chat_completion"]) for event in events]
    assert len(chunks) >= 2
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == base_text
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_multi_lora_example_serves_its_adapters(examples_server, base_text):
    def generate(lora_name: str) -> tuple[int, dict]:
        payload = {
            "text_input": PROMPT,
            "exclude_input_in_output": True,
            "parameters": {**GREEDY, "lora_name": lora_name},
        }
        reply = http_generate(examples_server.http_url, payload, model="lora_model")
        return reply.status_code, reply.json()

    status, adapted = generate("tiny-lora")
    assert status == 200, adapted
    assert adapted["text_output"] != base_text  # the adapter changes the greedy continuation
    status, copy = generate("tiny-lora-copy")
    assert (status, copy["text_output"]) == (200, adapted["text_output"])  # same weights under another name
    status, error = generate("no-such-lora")
    # The vLLM backend's text verbatim (Python's list of the names), after Triton's ensemble prefix
    assert status == 400
    assert error["error"].startswith(
        "in ensemble 'lora_model', LoRA no-such-lora is not supported,"
        " we currently support ['tiny-lora', 'tiny-lora-copy'] (lora_name='no-such-lora')"
    )


def test_lora_name_on_a_deployment_without_adapters_is_the_vllm_backends_error(examples_server):
    payload = {"text_input": PROMPT, "parameters": {**GREEDY, "lora_name": "tiny-lora"}}
    reply = http_generate(examples_server.http_url, payload, model="chat_model")
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("in ensemble 'chat_model', LoRA feature is not enabled. lora_name=")


def test_a_prompt_over_the_context_through_the_raw_preprocess_is_vllms_invalid_arg(examples_server):
    """The raw preprocess has no tokenizer: vLLM's own input check refuses the prompt, and the core answers it as
    the client's error (vLLM 0.32's VLLMValidationError is not a ValueError), not as an engine failure."""
    reply = http_generate(
        examples_server.http_url, {"text_input": "fox " * 2000, "parameters": GREEDY}, model="custom_model"
    )
    assert reply.status_code == 400, reply.text
    assert "engine failed" not in reply.text and "512" in reply.text


def test_engine_cpus_put_the_engines_loops_on_their_cpu_and_the_rest_of_the_server_off_it(examples_server):
    """core.engine_cpus (core/cpu_placement.py) of the custom deployment: the main thread of its engine processes
    (the EngineCore's loop, the workers vLLM starts) on CPU 1, their other threads (socket I/O, torch's helpers)
    off it; tritonserver, every stub and the other deployments' engines off it."""
    tree = process_tree(examples_server.process.pid)
    rest = frozenset(os.sched_getaffinity(0) - {1})

    def masks(pid: int) -> set[frozenset[int]]:
        return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}

    on_cpu1 = [pid for pid in tree if os.sched_getaffinity(pid) == {1}]  # the main thread's mask
    assert on_cpu1 and all(is_engine_process(pid) for pid in on_cpu1)
    titles = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in on_cpu1}
    custom_core = [pid for pid, title in titles.items() if title.startswith(b"VLLM::EngineCore")]
    assert len(custom_core) == 1  # the custom deployment's only
    # Its socket threads went off CPU 1; a thread its loop started later inherits the loop's CPU.
    assert rest in masks(custom_core[0]) and masks(custom_core[0]) <= {frozenset({1}), rest}
    engine_cores = [pid for pid in tree if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore")]
    assert len(engine_cores) == 3  # one per deployment of this server
    for pid in set(tree) - set(on_cpu1):
        assert masks(pid) == {rest}, pid
