"""tools/serve.py, the launcher: its first request goes to the repository's own model, each run has its own log,
and a server whose models fail to load is reported by model and error, once (real tritonserver, real vLLM)."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from repo_render import ROOT, main
from tests.support.deployment_helpers import own_deployment
from tools.serve import choose_model, new_log_file
from tools.triton_server import free_ports, load_failures

SERVE = ROOT / "tools" / "serve.py"

# Lines of a real Triton 2.51 log (a stage whose module did not import), as the server wrote them.
_ERROR = (
    r"ValueError: stage class 'mystages:Upper': cannot import module 'mystages': No module named 'mystages'"
    r"\n\nAt:\n  /work/core/stage.py(43): load_stage_class\n  /work/core/triton_models.py(133): initialize\n"
)
LOG_EXCERPT = "\n".join(
    [
        f'I1123 08:53:51.373602 11983 pb_stub.cc:366] "Failed to initialize Python stub: {_ERROR}"',
        f"E1123 08:53:51.793165 11983 model_lifecycle.cc:642] \"failed to load 'postprocess' version 1: Internal:"
        f' {_ERROR}"',
        "I1123 08:53:51.793182 11983 model_lifecycle.cc:777] \"failed to load 'postprocess'\"",
        "E1123 08:54:17.852548 11983 model_repository_manager.cc:703] \"Invalid argument: ensemble 'up_model' depends"
        " on 'postprocess' which has no loaded version. Model 'postprocess' loading failed with error: version 1 is"
        " at UNAVAILABLE state: Internal: ValueError: stage class 'mystages:Upper'\\n;\"",
        "error: creating server: Internal - failed to load all models",
        "",
    ]
)


def test_load_failures_name_each_model_with_its_error_and_traceback():
    failures = load_failures(LOG_EXCERPT + LOG_EXCERPT)  # a model named twice is reported once
    assert [f.model for f in failures] == ["postprocess", "up_model"]
    assert failures[0].lines == [
        "Internal: ValueError: stage class 'mystages:Upper': cannot import module 'mystages': No module named"
        " 'mystages'",
        "At:",
        "  /work/core/stage.py(43): load_stage_class",
        "  /work/core/triton_models.py(133): initialize",
    ]
    assert failures[1].lines == ["not loaded: its step 'postprocess' failed"]
    assert load_failures("I1123 model_lifecycle.cc:818] \"successfully loaded 'postprocess'\"\n") == []


def test_each_run_gets_its_own_log_file_and_only_the_last_ones_are_kept(tmp_path: Path):
    old = [tmp_path / f"tritonserver-20240101-0000{i:02d}-1.log" for i in range(5)]
    for path in old:
        path.write_text("old run")
    (tmp_path / "notes.txt").write_text("not a log")
    first = new_log_file(tmp_path, keep=3)
    assert first.exists() and first.read_text() == "" and first not in old
    assert sorted(tmp_path.glob("tritonserver-*.log")) == [*old[-2:], first]  # the newest two old ones, and this
    assert (tmp_path / "notes.txt").exists()


def test_the_first_request_goes_to_the_plain_public_model():
    assert choose_model({"chat_model": False, "chat_model_stream": True})[0] == "chat_model"
    model, why = choose_model({"a_model": False, "b_model": False, "a_stream": True})
    assert model == "a_model" and "others: b_model" in why and "streaming: a_stream" in why
    assert choose_model({"only_stream": True}) == (
        None,
        "no plain (non-streaming) public model in the repository (public: only_stream); pass --model",
    )


class Launcher:
    """tools/serve.py in its own process, its output read line by line."""

    def __init__(self, *args: str) -> None:
        http, grpc, metrics = free_ports(3)
        self.http_url = f"127.0.0.1:{http}"
        command = [sys.executable, str(SERVE), *args, f"--http-port={http}", f"--grpc-port={grpc}"]
        self.process = subprocess.Popen(
            [*command, f"--metrics-port={metrics}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 600) -> str:
        """The output up to the first line holding `text`, or all of it if the launcher ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                break
        return "\n".join(self.lines)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=90)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture(scope="module")
def moved_openai_repository(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The OpenAI example (models chat_model, chat_model_stream), rendered in one folder and moved to another."""
    workdir = tmp_path_factory.mktemp("serve")
    assert main([str(ROOT / "deployments" / "examples" / "openai.yaml"), "--out", str(workdir / "rendered")]) == 0
    shutil.move(workdir / "rendered", workdir / "moved")
    return workdir / "moved"


@pytest.mark.server  # tools/serve.py starts tritonserver in its own process: the guard cannot see it
def test_serve_asks_the_repositorys_own_model_and_logs_each_run_apart(
    moved_openai_repository: Path, tiny_model: Path, tmp_path: Path
):
    logs = tmp_path / "logs"
    launcher = Launcher("--repository", str(moved_openai_repository), "--log-dir", str(logs))
    try:
        output = launcher.wait_for("Serving until Ctrl-C.")
    finally:
        code = launcher.stop()
    assert "Serving until Ctrl-C." in output, output
    (log,) = logs.glob("tritonserver-*.log")
    assert f"Log: {log}" in output
    assert "First request to 'chat_model' (the repository's plain public model; streaming: chat_model_stream" in output
    answer = json.loads(next(line for line in launcher.lines if line.startswith("{")))
    assert answer["model_name"] == "chat_model"
    assert json.loads(answer["chat_completion"])["object"] == "chat.completion"
    # Rendered outside a project, the model path is absolute: the moved repository still finds the model.
    engine_args = json.loads((moved_openai_repository / "vllm_core" / "1" / "model.json").read_text())
    assert engine_args["model"] == str(tiny_model)
    assert code == 0


@pytest.mark.server
def test_serve_names_the_model_that_failed_to_load_and_its_error_without_retrying(tiny_model: Path, tmp_path: Path):
    config = own_deployment(tmp_path, tiny_model, stage="Broken")  # raises in __init__, when the stub loads it
    assert main([str(config), "--out", str(tmp_path / "repo")]) == 0
    log = tmp_path / "server.log"
    log.write_text("an earlier run's line: failed to load 'old_model' version 1: Internal: stale\n")
    launcher = Launcher("--repository", str(tmp_path / "repo"), "--log-file", str(log))
    try:
        output = launcher.wait_for("no such line: read until the launcher ends")
    finally:
        code = launcher.stop()
    assert code == 1, output
    assert "tritonserver exited with code 1 before it was ready" in output
    assert "these models failed to load:" in output
    assert "model 'postprocess': Internal: RuntimeError: the shouting table is missing" in output
    assert "shouting/stage.py" in output and "__init__" in output  # the stub's traceback frames
    assert "model 'vllm_model': not loaded: its step 'postprocess' failed" in output
    assert "old_model" not in output  # only this run's part of an appended log
    assert "starting again" not in output  # a model that fails to load fails again: no second start
    assert log.read_text().count("failed to load 'postprocess' version") == 1
