"""core.hold_outputs_in_engine in a real server (core/engine_hold.py): the EngineCore, spawned in its own process or
run in the core's, holds the per-token outputs of non-streamed requests and of streamed ones between vLLM's
stream_interval tokens, and every answer is the one a request that is never held (logprobs) gets: the same greedy
text, every token counted, the streamed deltas adding up to the plain answer."""

from __future__ import annotations

import json

import pytest

from tests.support.reliability_helpers import default_engine_args, render_repository
from tests.support.triton_helpers import PLAIN_MODEL, grpc_inputs, grpc_stream
from tools.triton_server import start_on_free_ports

pytestmark = pytest.mark.server

MAX_TOKENS = 12
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
HOLDING = "core.hold_outputs_in_engine: this EngineCore (process"


@pytest.mark.parametrize(
    ("entry", "multiprocessing"),
    [("plain-core", "1"), ("ensemble", "0")],
    ids=["spawned-engine-core", "engine-core-in-process"],
)
def test_held_outputs_give_the_answers_of_outputs_never_held(tiny_model, tmp_path, entry, multiprocessing):
    import tritonclient.grpc as grpcclient

    repository = render_repository(
        tmp_path / "repository",
        entry=entry,
        core={"hold_outputs_in_engine": True},
        health={"restart_engine": False},
        engine_args=default_engine_args(stream_interval=4),
        engine_env={"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing},
    )
    log = tmp_path / "tritonserver.log"
    server = start_on_free_ports(repository, log)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for prompt in ("The quick brown fox", "Grüße aus München und"):
            plain = client.infer(PLAIN_MODEL, grpc_inputs(prompt, GREEDY, return_num_output_tokens=True))
            text = plain.as_numpy("text_output")[0].decode()
            assert plain.as_numpy("num_output_tokens")[0] == MAX_TOKENS
            # logprobs: read token by token, so never held
            reference = client.infer(PLAIN_MODEL, grpc_inputs(prompt, {**GREEDY, "logprobs": 1}, return_logprobs=True))
            assert text == reference.as_numpy("text_output")[0].decode()
            assert len(json.loads(reference.as_numpy("logprobs")[0])) == MAX_TOKENS
            deltas = grpc_stream(server.grpc_url, grpc_inputs(prompt, GREEDY, stream=True))
            assert prompt + "".join(d["text_output"][0].decode() for d, _ in deltas) == text  # plain echoes the prompt
        client.close()
        assert HOLDING in log.read_text(errors="replace"), "the EngineCore never held an output"
    finally:
        server.stop()
