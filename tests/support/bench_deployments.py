"""Deployment files for tools/bench.py's integration tests on the tiny model."""

from __future__ import annotations

from pathlib import Path


def shared_engine_deployment(folder: Path, model: Path, front_ends: int = 2) -> Path:
    """The tiny model with its EngineCore in a process of its own, shared by `front_ends` clients: the core's front
    ends in our server, the benchmark's bare-front-ends paths beside it."""
    path = folder / "front-ends.yaml"
    path.write_text(
        f"model: {model}\n"
        "engine_args:\n"
        "  enforce_eager: true\n"
        "  max_model_len: 512\n"
        "  kv_cache_memory_bytes: 268435456\n"
        "  gpu_memory_utilization: 0.05\n"  # on a GPU: the share vLLM wants free at start, beside other tests' engines
        "  disable_log_stats: true\n"
        "engine_env:\n"
        '  OMP_NUM_THREADS: "1"\n'
        '  VLLM_ENABLE_V1_MULTIPROCESSING: "1"\n'  # an EngineCore process that clients can share
        "core:\n"
        f"  front_ends: {front_ends}\n"
        "health:\n"
        "  restart_engine: false\n",
        encoding="utf-8",
    )
    return path
