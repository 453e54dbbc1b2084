"""vLLM's EngineCore spawned as a fresh `python3` instead of forked from the process that creates the engine.

On a GPU, vLLM starts its EngineCore (the scheduler's busy loop, one CPU core at full load on a small model) by
forking the process that creates the engine: for the core, the Triton Python-backend stub. The stub runs Python
through the shared `libpython` it links, and a fork keeps running that interpreter. Distribution builds of the
shared libpython are slower at pure Python than their `python3` binary (built static: measured on this project's
Debian CPU machine, a dict loop 22.7 ms in an embedded libpython3.11, in its forked child too, against 19.2 ms in
/usr/bin/python3.11). On the H100, profiled side by side on one machine, a forked EngineCore's decode steps ran
4-18 % slower inside the server than the bare engine's at the same batch, a spawned one's as fast
(docs/performance-gpu.md).

So `install` makes spawn the default (a deployment's `engine_env` may still set `VLLM_WORKER_MULTIPROC_METHOD`),
and checks that the Python a spawn starts (multiprocessing's executable, found through tritonserver's PATH in a
stub) is this Python's version, so a mismatch fails the model's load with a message instead of an EngineCore that
cannot import vLLM. Without vLLM's multiprocessing (VLLM_ENABLE_V1_MULTIPROCESSING=0) there is no EngineCore
process, and nothing to check.
"""

from __future__ import annotations

import multiprocessing.spawn
import os
import subprocess
import sys

METHOD_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"
DEFAULTS = {METHOD_VARIABLE: "spawn"}
_checked: set[str] = set()  # the executables already found right (the core prepares its process more than once)


def install() -> None:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    if os.environ[METHOD_VARIABLE] == "spawn" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
        executable = multiprocessing.spawn.get_executable()
        if str(executable) not in _checked:
            check_spawn_executable(executable)
            _checked.add(str(executable))


def check_spawn_executable(executable: str | bytes | None, version: tuple[int, int] = sys.version_info[:2]) -> None:
    """Raise RuntimeError unless `executable` runs a Python of `version`."""
    wanted = f"{version[0]}.{version[1]}"
    found = None
    if executable:
        try:
            found = subprocess.run(
                [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found = None
    if found != wanted:
        got = f"Python {found}" if found else "no working Python"
        raise RuntimeError(
            f"engine_env.{METHOD_VARIABLE}: spawn (the default) starts vLLM's EngineCore with {executable!r}, which is"
            f" {got}, not this process's Python {wanted}: put Python {wanted} first on tritonserver's PATH, or set"
            f" engine_env.{METHOD_VARIABLE}: fork in the deployment (docs/deployments.md)"
        )
