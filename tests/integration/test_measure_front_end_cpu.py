"""tools/measure_front_end_cpu.py on the real (CPU) engine, in a process of its own (it turns vLLM's multiprocessing
on for itself): each counted wave is reported with this process's and the EngineCore process's CPU, then the median."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support.reliability_helpers import vllm_ipc_sockets

pytestmark = pytest.mark.server


def test_waves_of_requests_report_the_front_ends_cpu_and_the_engine_cores_apart(tiny_model):
    command = [sys.executable, str(ROOT / "tools" / "measure_front_end_cpu.py"), "--requests", "64"]
    sockets_before = vllm_ipc_sockets()
    result = subprocess.run(
        [*command, "--max-tokens", "8", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert vllm_ipc_sockets() <= sockets_before  # its engine's socket files went with its own TMPDIR
    rounds = re.findall(r"round \d: front end ([\d.]+) ms CPU a request, EngineCore ([\d.]+) ms", result.stdout)
    assert len(rounds) == 2, result.stdout
    # the front end (this tool's process, timed to the nanosecond) worked on every wave; the EngineCore (its child,
    # counted in 10 ms clock ticks) on the waves together
    assert all(float(front) > 0 for front, _ in rounds)
    assert sum(float(core) for _, core in rounds) > 0
    assert re.search(r"front end CPU a request: median [\d.]+ ms over 2 rounds", result.stdout)
