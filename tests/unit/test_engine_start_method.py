"""The EngineCore's start method (core/engine_start_method.py): spawn by default, and a spawn executable that is
not this Python fails with a message naming the setting."""

from __future__ import annotations

import os
import sys

import pytest

from core import engine_start_method
from core.engine_start_method import METHOD_VARIABLE, check_spawn_executable, install


def test_spawn_is_the_default_and_a_deployment_may_choose_fork(monkeypatch):
    monkeypatch.delenv(METHOD_VARIABLE, raising=False)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    install()  # this test's Python is the one a spawn starts: the check passes
    assert os.environ[METHOD_VARIABLE] == "spawn"
    monkeypatch.setenv(METHOD_VARIABLE, "fork")
    install()
    assert os.environ[METHOD_VARIABLE] == "fork"


def test_the_python_a_spawn_starts_must_be_this_one():
    check_spawn_executable(sys.executable)  # no error
    with pytest.raises(RuntimeError, match=r"VLLM_WORKER_MULTIPROC_METHOD.*Python 2\.7") as wrong:
        check_spawn_executable(sys.executable, version=(2, 7))
    assert f"Python {sys.version_info[0]}.{sys.version_info[1]}, not" in str(wrong.value)
    with pytest.raises(RuntimeError, match="no working Python"):
        check_spawn_executable("/nonexistent/python3")
    with pytest.raises(RuntimeError, match="no working Python"):
        check_spawn_executable("")


def test_a_wrong_spawn_executable_fails_install_unless_nothing_is_spawned(monkeypatch):
    monkeypatch.setenv(METHOD_VARIABLE, "spawn")
    monkeypatch.setattr(engine_start_method.multiprocessing.spawn, "get_executable", lambda: "/nonexistent/python3")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: nothing to check
    install()
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(RuntimeError, match="/nonexistent/python3"):
        install()
