"""Ask Linux for AMX before vLLM's CPU attention uses it.

On x86 Linux a process must request the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM) before any of its threads
executes an AMX instruction; without it the first one kills the process with SIGILL. vLLM's CPU attention picks its
AMX kernel for bfloat16 whenever the CPU reports AMX (`torch.cpu._is_amx_tile_supported`), but nothing in the
engine's process is sure to have requested the permission first: oneDNN requests it when its own AMX matmuls run,
which happens or not before the attention kernel depending on the shapes and the order of the first step.
Measured on a 2-vCPU Intel VM with AMX (2026-11-23): the test suite's engines (in the Triton stub and in forked
EngineCore/worker processes) died with SIGILL (worker exit code -4), on this project's earlier commits too; a
plain `python` process running the same model did not.

`install` requests the permission (torch.cpu._init_amx) when the CPU reports AMX; a no-op elsewhere (GPU hosts
without AMX, ARM). Registered as a vLLM general plugin (pyproject.toml), so it runs in every process vLLM starts,
and called by the core before the engine starts (core.engine.prepare_process_environment).
"""

from __future__ import annotations


def install() -> bool:
    """Request AMX for this process; True when the CPU has AMX and Linux granted it."""
    try:
        import torch
    except ImportError:
        return False
    cpu = getattr(torch, "cpu", None)
    if cpu is None or not hasattr(cpu, "_is_amx_tile_supported") or not hasattr(cpu, "_init_amx"):
        return False
    return bool(cpu._is_amx_tile_supported() and cpu._init_amx())
