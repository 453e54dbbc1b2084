"""The launcher (tools/triton_server.py) names the cause when tritonserver dies because the host ran out of threads:
it starts thread-pool-size threads for every Python model instance, so large instance counts can reach the host's
thread limit, and tritonserver then dies during load with SIGSEGV and no model named in its log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from repo_render import load_deployment, render, write
from tools.triton_server import (
    PYTHON_BACKEND_DEFAULT_THREADS,
    OutOfThreadsError,
    TritonServer,
    out_of_threads,
    python_backend_threads,
    python_instances,
)

BENCH = Path(__file__).resolve().parents[2] / "deployments" / "examples" / "gpu-bench-1b.yaml"
# What the H100 host's log showed (a stub's OpenBLAS, then Python in a spawned EngineCore), shortened.
LOG = (
    'I1125 23:49:41.1 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: preprocess_0_11 (CPU device 0)"\n'
    "OpenBLAS blas_thread_init: pthread_create failed for thread 15 of 16: Resource temporarily unavailable\n"
    "(EngineCore pid=18351) can't start new thread\n"
)


@pytest.fixture(scope="module")
def bench_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("repo")
    write(render(load_deployment(BENCH), out), out)
    return out


def test_the_python_instances_of_a_rendered_repository_are_counted(bench_repository: Path):
    # 12 preprocess + 4 plain front ends (entry: plain-core) + 4 core front ends; the streaming ensemble has none
    assert python_instances(bench_repository) == 24


def test_a_config_that_does_not_parse_is_left_to_tritons_own_message(tmp_path: Path):
    (tmp_path / "good" / "1").mkdir(parents=True)
    (tmp_path / "good" / "config.pbtxt").write_text('backend: "python"\ninstance_group { count: 3 }\n')
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.pbtxt").write_text("not a model config {")
    assert python_instances(tmp_path) == 3


def test_a_log_that_says_a_thread_could_not_start_gets_the_cause_and_the_count(bench_repository: Path):
    reason = out_of_threads(LOG, bench_repository)
    assert reason is not None and "ran out of threads" in reason
    # entry: plain-core: no model of it calls another by BLS, so the pool keeps the backend's default
    assert "thread-pool-size (32)" in reason and "has 24 (about 768 threads)" in reason
    assert "instance counts or generate.max_in_flight" in reason and "pids.max" in reason


def _rendered(tmp_path: Path, generate: str) -> Path:
    tmp_path.mkdir()
    config = tmp_path / "deployment.yaml"
    config.write_text(f"model: ./m\ngenerate: {generate}\n")
    out = tmp_path / "repo"
    write(render(load_deployment(config), out), out)
    return out


def test_the_pool_is_sized_by_the_repositorys_bls_threads(bench_repository: Path, tmp_path: Path):
    # generate.max_in_flight (512 by default) worker threads each hold a BLS call: the pool is that large, and no
    # larger, since tritonserver starts it for every Python instance.
    assert python_backend_threads(_rendered(tmp_path / "default", "{instances: 1}")) == 512
    # the GPU benchmark deployment (entry: plain-core) has no BLS caller: the backend's default
    assert python_backend_threads(bench_repository) == 32
    assert python_backend_threads(_rendered(tmp_path / "a", "{instances: 4, max_in_flight: 128}")) == 128
    # never below the Python backend's own default
    assert python_backend_threads(_rendered(tmp_path / "b", "{max_in_flight: 8}")) == 32
    assert python_backend_threads(tmp_path / "none") == PYTHON_BACKEND_DEFAULT_THREADS == 32


def test_any_other_log_is_not_taken_for_it(bench_repository: Path):
    failed_load = "E1125 model_lifecycle.cc:642] \"failed to load 'x' version 1: boom\"\n"
    assert out_of_threads(failed_load, bench_repository) is None


def test_a_server_that_died_so_raises_out_of_threads_and_is_not_started_again(bench_repository: Path, tmp_path: Path):
    log = tmp_path / "tritonserver.log"
    log.write_text(LOG)
    server = TritonServer(bench_repository, log_file=log)
    starts = []

    def start() -> None:  # tritonserver as it died on the H100 host: SIGSEGV during load, the log above
        starts.append(1)
        server.process = subprocess.Popen(["sh", "-c", "kill -SEGV $$"])
        server.process.wait()

    server.start = start  # type: ignore[method-assign]
    server.stop = lambda grace=None: None  # type: ignore[method-assign]
    with pytest.raises(OutOfThreadsError, match=r"exited with code -11 .*ran out of threads"):
        server.start_and_wait(timeout=5, attempts=2)
    assert len(starts) == 1  # a second start would run out of threads the same way
