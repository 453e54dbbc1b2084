"""Chat requests against vLLM's own `LLM.chat` (run offline in a separate process): the token ids preprocess
computes, and the greedy output through both ensembles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from preprocess.default import Preprocessor
from tests.support.chat_cases import CHAT_CASES
from tests.support.triton_helpers import (
    GREEDY,
    PLAIN_MODEL,
    REFERENCE_MAX_TOKENS,
    STREAM_MODEL,
    grpc_stream,
    http_generate,
)

ROOT = Path(__file__).resolve().parents[2]
MODEL_JSON = ROOT / "model_repository" / "vllm_core" / "1" / "model.json"
# The default deployment refuses per-request templates: those cases go through the stage only.
SERVED = [i for i, case in enumerate(CHAT_CASES) if "chat_template" not in case["options"]]

pytestmark = pytest.mark.server


def run_offline(
    cases: list,
    workdir: Path,
    model_json: Path = MODEL_JSON,
    max_tokens: int = REFERENCE_MAX_TOKENS,
    chat: bool = True,
) -> list[dict]:
    """vLLM's LLM.chat (or LLM.generate) for each case, in a separate process (tools/offline_generate.py)."""
    (workdir / "cases.json").write_text(json.dumps(cases, ensure_ascii=False))
    log = workdir / "offline.log"
    with open(log, "wb") as out:
        code = subprocess.run(
            [
                sys.executable,
                str(ROOT / "tools" / "offline_generate.py"),
                str(model_json),
                str(workdir / "cases.json"),
                str(workdir / "out.json"),
                f"--max-tokens={max_tokens}",
                *(["--chat"] if chat else []),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"},
            timeout=900,
        ).returncode
    assert code == 0, f"offline vLLM failed ({code}):\n{log.read_text()[-3000:]}"
    return json.loads((workdir / "out.json").read_text())


@pytest.fixture(scope="module")
def llm_chat_outputs(tiny_model, tmp_path_factory) -> list[dict]:
    return run_offline(CHAT_CASES, tmp_path_factory.mktemp("offline_chat"))


def _text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


@pytest.mark.parametrize("index", range(len(CHAT_CASES)))
def test_preprocess_token_ids_equal_llm_chat(tiny_model, llm_chat_outputs, index):
    case = CHAT_CASES[index]
    stage = Preprocessor({"tokenizer": str(tiny_model), "allow_request_chat_template": True})
    inputs = {"messages": _text(json.dumps(case["messages"])), "chat_options": _text(json.dumps(case["options"]))}
    request = stage.build_request(inputs, {})
    assert request.prompt_token_ids == llm_chat_outputs[index]["prompt_token_ids"]


@pytest.mark.parametrize("index", SERVED)
def test_chat_through_the_plain_ensemble_equals_llm_chat(grpc_client, llm_chat_outputs, index):
    import tritonclient.grpc as grpcclient

    case = CHAT_CASES[index]
    arrays = {
        "messages": _text(json.dumps(case["messages"])),
        "chat_options": _text(json.dumps(case["options"])),
        "sampling_parameters": _text(json.dumps(GREEDY)),
        "exclude_input_in_output": np.array([True]),
        "return_num_input_tokens": np.array([True]),
    }
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    result = grpc_client.infer(PLAIN_MODEL, inputs)
    expected = llm_chat_outputs[index]
    assert result.as_numpy("text_output")[0].decode("utf-8") == expected["text"]
    assert int(result.as_numpy("num_input_tokens")[0]) == len(expected["prompt_token_ids"])


def test_chat_through_the_streaming_ensemble_equals_llm_chat(server, llm_chat_outputs):
    import tritonclient.grpc as grpcclient

    index = SERVED[-1]
    case = CHAT_CASES[index]
    inputs = []
    for name, array in {
        "messages": _text(json.dumps(case["messages"])),
        "chat_options": _text(json.dumps(case["options"])),
        "sampling_parameters": _text(json.dumps(GREEDY)),
        "stream": np.array([True]),
    }.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    responses = grpc_stream(server.grpc_url, inputs, model=STREAM_MODEL)
    text = "".join(out["text_output"][0].decode("utf-8") for out, _ in responses if "text_output" in out)
    assert text == llm_chat_outputs[index]["text"]


def test_chat_through_generate_with_options_as_request_parameters(server, llm_chat_outputs):
    """/generate: messages as a JSON string, chat options as request parameters next to sampling parameters."""
    index = 2  # continue_final_message
    case = CHAT_CASES[index]
    reply = http_generate(
        server.http_url,
        {
            "messages": json.dumps(case["messages"]),
            "exclude_input_in_output": True,
            "parameters": {**GREEDY, "add_generation_prompt": False, "continue_final_message": True},
        },
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["text_output"] == llm_chat_outputs[index]["text"]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"text_input": "hi", "messages": '[{"role": "user", "content": "hi"}]'}, "both given"),
        ({"messages": "[]"}, "non-empty JSON list"),
        ({"messages": '[{"role": "wizard", "content": "hi"}]'}, "'wizard' is not one of"),
        (
            {"messages": '[{"role": "user", "content": "hi"}]', "chat_options": '{"chat_template": "{{ 1 }}"}'},
            "does not accept per-request chat templates",
        ),
        ({"text_input": "hi", "parameters": {"add_generation_prompt": True}}, "apply to messages requests only"),
    ],
)
def test_bad_chat_requests_get_invalid_arg(server, payload, message):
    reply = http_generate(server.http_url, payload)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]
