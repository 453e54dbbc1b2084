"""The `server` mark's guard (tests/conftest.py): a test without the mark cannot start tritonserver or a vLLM
engine, so `pytest -m "not server"` stays free of both even when a new test forgets its mark."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.engine import Engine
from tools.triton_server import TritonServer


def test_an_unmarked_test_that_starts_tritonserver_fails_before_the_process_exists(tmp_path: Path) -> None:
    server = TritonServer(tmp_path, log_file=tmp_path / "tritonserver.log")
    with pytest.raises(pytest.fail.Exception, match=r"starts tritonserver but is not marked: add pytest.mark.server"):
        server.start()
    assert server.process is None


def test_an_unmarked_test_that_builds_a_vllm_engine_fails_before_vllm_is_asked(monkeypatch) -> None:
    # Skip the version check (it imports vLLM): the guard sits on the step after it, building the AsyncLLM.
    monkeypatch.setattr("core.engine.check_vllm_version", lambda: None)
    engine = Engine({"model": "/nonexistent/model"})
    with pytest.raises(pytest.fail.Exception, match=r"starts a vLLM engine but is not marked"):
        engine.start()
    assert engine._llm is None
