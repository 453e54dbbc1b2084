"""tools/bench.py stopped by SIGTERM (what `timeout` and job schedulers send): the servers, engines and workers it
started run in sessions of their own, so the signal's default (this process dies alone) left them running. On the
H100 an orphaned benchmark server kept ~14,000 threads and its engines' GPU memory, and the next run on the machine
failed with "can't start new thread". `timeout` signals the benchmark's whole process group, its client processes
too (--client-processes): on the H200 their closed pipes then failed the first group's close and the groups after it
were never closed (`vllm serve` left running). Measured here with the real server and engine, signalled as `timeout`
does: every process the run started is gone once it exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.bench_deployments import shared_engine_deployment
from tests.support.reliability_helpers import vllm_ipc_sockets

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
START_SECONDS = 300  # both engines up (CPU) and one level measured
STOP_SECONDS = 120  # the server's exit timeout, the bare worker's engine shutdown


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
    return parents


def _descendants(root: int) -> set[int]:
    parents = _parents()
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Running, not a zombie that nobody reaped yet (a container's init may not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:200]
    except OSError:
        return ""


def _measured(results: Path) -> set[str]:
    try:
        return {run["path"] for run in json.loads(results.read_text())["runs"]}
    except (OSError, ValueError, KeyError):
        return set()


def _assert_gone(started: dict[int, str]) -> None:
    """Every process of `started` (pid -> its command line) has exited; any left is killed, not left running for the
    rest of the suite."""
    deadline = time.monotonic() + 10  # a process that was killed last may still be on its way out
    while (left := {pid for pid in started if _alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, {pid: started[pid] for pid in left}


def _terminate_as_timeout_does(bench: subprocess.Popen) -> None:
    """SIGTERM as GNU `timeout` sends it: to the benchmark, then to its whole process group (so the benchmark gets
    it twice). It must stop early, closing every group, the second signal not cutting that closing short."""
    os.kill(bench.pid, signal.SIGTERM)
    os.killpg(bench.pid, signal.SIGTERM)
    output, _ = bench.communicate(timeout=STOP_SECONDS)
    assert bench.returncode == 1, output[-3000:]
    assert "bench: stopped early (interrupted)" in output, output[-3000:]
    assert "unhandled exception" not in output and "Unclosed" not in output, output[-3000:]  # every group closed
    assert "Task exception was never retrieved" not in output and "Event loop is closed" not in output, output[-3000:]


def test_sigterm_stops_every_process_the_run_started(tmp_path: Path):
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "tools" / "bench.py"), "--paths", "bare,plain-grpc", "--levels", "1"]
    command += ["--max-tokens", "8", "--reps", "1000", "--interleave", "--client-processes", "2", "--out", str(out)]
    sockets_before = vllm_ipc_sockets()
    bench = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        while _measured(out / "results.json") != {"bare", "plain-grpc"}:
            assert bench.poll() is None, f"bench exited early:\n{bench.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "no level measured on both paths in time"
            time.sleep(1)
        started = _descendants(bench.pid)
        names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in started if _alive(pid)}
        assert "tritonserver" in names, names  # the run's server is among them, and the engines' processes
        assert any("multiprocessing" in _command(pid) for pid in started)  # its client processes
        _terminate_as_timeout_does(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    # what it measured before the signal is kept, each run with its place in the turn (ours first, then its baseline)
    assert _measured(out / "results.json") == {"bare", "plain-grpc"}
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(run["path"], run["turn_index"]) for run in runs} == {("plain-grpc", 0), ("bare", 1)}
    _assert_gone({pid: _command(pid) for pid in started})
    # nor files: the bare worker's engine named its ZMQ sockets in a folder of its own, removed at its stop
    assert vllm_ipc_sockets() <= sockets_before


def test_a_server_whose_path_fails_its_token_check_is_stopped(tiny_model: Path, tmp_path: Path):
    # The benchmark's ~400-token prompts do not fit this engine: the token check, as the server opens, gets an error
    # for them. The run stops there, and the server it started is stopped with it (it was not yet "opened").
    deployment = tmp_path / "short.yaml"
    deployment.write_text(
        f"model: {tiny_model}\nengine_args:\n  enforce_eager: true\n  max_model_len: 128\n"
        "  kv_cache_memory_bytes: 268435456\n  gpu_memory_utilization: 0.05\n  disable_log_stats: true\n",
        encoding="utf-8",
    )
    command = [sys.executable, str(ROOT / "tools" / "bench.py"), "--deployment", str(deployment)]
    command += ["--paths", "plain-grpc", "--levels", "1", "--max-tokens", "4", "--out", str(tmp_path / "out")]
    bench = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: dict[int, str] = {}  # every process the run started (the server, its stubs, their EngineCore), seen alive
    try:
        deadline = time.monotonic() + START_SECONDS
        while bench.poll() is None and time.monotonic() < deadline:
            started |= {pid: _command(pid) for pid in _descendants(bench.pid) if pid not in started}
            time.sleep(0.5)
        output, _ = bench.communicate(timeout=STOP_SECONDS)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, output[-3000:]
    assert any("tritonserver" in command for command in started.values()), "the run's server was never seen"
    assert "bench: stopped early (InferenceServerException" in output, output[-3000:]
    _assert_gone(started)


def test_sigterm_while_engines_start_together_stops_every_process(tiny_model: Path, tmp_path: Path):
    """--parallel-starts: the signal comes while the front ends' engine and the server boot at once (both launched,
    the run waiting for the first); every process either had started is gone once the run exits."""
    command = [sys.executable, str(ROOT / "tools" / "bench.py")]
    command += ["--deployment", str(shared_engine_deployment(tmp_path, tiny_model))]
    command += ["--paths", "bare,bare-front-ends,plain-grpc", "--levels", "1", "--max-tokens", "8", "--reps", "1"]
    command += ["--interleave", "--parallel-starts", "--out", str(tmp_path / "out")]
    sockets_before = vllm_ipc_sockets()
    bench = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    started: dict[int, str] = {}  # every process the run started, seen alive
    try:
        deadline = time.monotonic() + START_SECONDS
        # the bare engine up first, then the launcher of the front ends' engine and tritonserver both under way
        while not (
            any("--front-ends-launcher" in line for line in started.values())
            and any("tritonserver" in line for line in started.values())
        ):
            assert bench.poll() is None, f"bench exited early:\n{bench.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "the two later starts were not seen under way together"
            started |= {pid: _command(pid) for pid in _descendants(bench.pid) if pid not in started}
            time.sleep(0.5)
        assert not _measured(tmp_path / "out" / "results.json")  # still starting: nothing measured yet
        started |= {pid: _command(pid) for pid in _descendants(bench.pid) if pid not in started}
        _terminate_as_timeout_does(bench)
    finally:
        if bench.poll() is None:
            bench.kill()
    _assert_gone(started)
    assert vllm_ipc_sockets() <= sockets_before
