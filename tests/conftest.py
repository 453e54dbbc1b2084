"""Shared fixtures: one real tritonserver (real Python backend, real vLLM CPU engine) for the whole session,
and vLLM's own offline output for the reference prompts, computed in a separate process meanwhile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.triton_helpers import REFERENCE_MAX_TOKENS, REFERENCE_PROMPTS
from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL_DIR
from tools.build_tiny_model import build as build_tiny_model
from tools.triton_server import start_on_free_ports

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_model(TINY_MODEL_DIR)


@pytest.fixture(scope="session")
def offline_reference_process(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """Start vLLM offline generation for the reference prompts before the server, to overlap start-ups."""
    workdir = tmp_path_factory.mktemp("offline")
    prompts = workdir / "prompts.json"
    prompts.write_text(json.dumps(REFERENCE_PROMPTS, ensure_ascii=False))
    out = workdir / "outputs.json"
    log = open(workdir / "offline.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tools" / "offline_generate.py"),
            str(REPOSITORY / "vllm_core" / "1" / "model.json"),
            str(prompts),
            str(out),
            f"--max-tokens={REFERENCE_MAX_TOKENS}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"},
    )
    yield process, out, workdir / "offline.log"
    if process.poll() is None:
        process.kill()
    process.wait()
    log.close()


@pytest.fixture(scope="session")
def offline_outputs(offline_reference_process) -> list[dict]:
    process, out, log = offline_reference_process
    code = process.wait(timeout=600)
    assert code == 0, f"offline vLLM generation failed ({code}); see {log}:\n{log.read_text()[-3000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def server(tiny_model: Path, offline_reference_process, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    instance = start_on_free_ports(REPOSITORY, log, exit_timeout_secs=10)
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def grpc_client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def http_client(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url, concurrency=16)
    yield client
    client.close()
