"""Shared fixtures: one real tritonserver (real Python backend, real vLLM CPU engine) for the whole session,
and vLLM's own offline output for the reference prompts, computed in a separate process meanwhile.

The `server` mark sorts the suite: `pytest -m "not server"` runs the unit tests alone, with no tritonserver
and no vLLM engine. A test that uses a fixture of SERVER_FIXTURES is marked here; a test that starts its own
server or engine carries the mark itself, and an unmarked test that starts either fails at once (a guard on
TritonServer.start and Engine._new_llm), so a forgotten mark cannot slip a server into the unit run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from core.engine import Engine
from tests.support.triton_helpers import REFERENCE_MAX_TOKENS, REFERENCE_PROMPTS
from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL_DIR
from tools.build_tiny_model import build as build_tiny_model
from tools.triton_server import TritonServer, start_on_free_ports

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"

# Fixtures that start tritonserver or vLLM (the shared server, and the offline vLLM run it overlaps with); the
# ones that depend on them (grpc_client, offline_outputs, ...) are covered too: fixturenames is the closure.
SERVER_FIXTURES = frozenset({"server", "offline_reference_process"})

# The node id of the unit test (no `server` mark) being set up, run or torn down; None during a server test.
_unit_test: str | None = None


@pytest.hookimpl(tryfirst=True)  # before the `-m` deselection, which reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


@pytest.hookimpl(tryfirst=True)  # before the fixtures of the test are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    global _unit_test
    _unit_test = None if item.get_closest_marker("server") else item.nodeid


def _unit_tests_may_not(what: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _unit_test is not None:
            pytest.fail(f"{_unit_test} starts {what} but is not marked: add pytest.mark.server", pytrace=False)
        return method(*args, **kwargs)

    return guarded


_GUARDED = ((TritonServer, "start", "tritonserver"), (Engine, "_new_llm", "a vLLM engine"))


def pytest_configure(config: pytest.Config) -> None:
    for owner, name, what in _GUARDED:
        setattr(owner, name, _unit_tests_may_not(what, getattr(owner, name)))


def pytest_unconfigure(config: pytest.Config) -> None:
    for owner, name, _ in _GUARDED:
        setattr(owner, name, getattr(owner, name).__wrapped__)


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
