"""The launcher's exit timeout (tools/triton_server.py exit_timeout_for): Triton's Python backend unloads a model's
instances one after another, a second or more each (docs/platform-notes.md T11), so a repository whose largest
Python model has many instances gets a longer timeout than the 15 s that serve a small one."""

from __future__ import annotations

from pathlib import Path

from repo_render import load_deployment, render, write
from tools.triton_server import (
    DEFAULT_EXIT_TIMEOUT_SECONDS,
    UNLOAD_SECONDS_PER_INSTANCE,
    TritonServer,
    exit_timeout_for,
    python_instance_counts,
)

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "deployments" / "examples" / "gpu-bench-1b.yaml"


def test_the_gpu_benchmark_deployment_gets_time_to_unload_its_twelve_preprocess_instances(tmp_path: Path):
    write(render(load_deployment(BENCH), tmp_path), tmp_path)
    assert python_instance_counts(tmp_path) == {"preprocess": 12, "vllm_model": 8, "vllm_core": 4}
    # measured on the H100 host: these 12 instances were still loaded when a 15 s exit timeout ran out
    timeout = exit_timeout_for(tmp_path)
    assert timeout > DEFAULT_EXIT_TIMEOUT_SECONDS
    assert timeout >= 12 * UNLOAD_SECONDS_PER_INSTANCE
    server = TritonServer(tmp_path)
    assert f"--exit-timeout-secs={timeout}" in server.command()


def test_a_small_repository_keeps_the_default_and_an_explicit_timeout_wins():
    repository = ROOT / "model_repository"  # the default deployment: 2 instances at most
    assert max(python_instance_counts(repository).values()) <= 2
    assert exit_timeout_for(repository) == DEFAULT_EXIT_TIMEOUT_SECONDS
    assert "--exit-timeout-secs=7" in TritonServer(repository, exit_timeout_secs=7).command()


def test_a_repository_without_python_models_keeps_the_default(tmp_path: Path):
    assert exit_timeout_for(tmp_path) == DEFAULT_EXIT_TIMEOUT_SECONDS
