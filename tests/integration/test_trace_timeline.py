"""tools/trace_timeline.py against a real tritonserver: Triton's trace is turned on through its API for the traced
requests only, every ensemble step is timed in order, and the core's first-response counters are printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL
from tools.trace_timeline import main

pytestmark = pytest.mark.server


def _timeline(output: str, ensemble: str) -> list[str]:
    block = output.split(f"\n{ensemble}: ", 1)[1].split("\n\n", 1)[0]
    return [line.split(None, 1)[1] for line in block.splitlines()[1:] if line.startswith("  ") and " ms" not in line]


def test_each_step_of_a_traced_request_is_timed_and_the_core_breaks_its_first_response_down(tmp_path: Path, capsys):
    assert main(["--requests", "3", "--max-tokens", "4", "--out", str(tmp_path)]) == 0
    output = capsys.readouterr().out
    assert f"{STREAM_MODEL}: 3 requests traced" in output and f"{PLAIN_MODEL}: 3 requests traced" in output
    streamed = _timeline(output, STREAM_MODEL)
    order = ["preprocess COMPUTE_START", "vllm_core COMPUTE_START", "postprocess REQUEST_START"]
    assert [step for step in streamed if step in order] == order
    assert "generate COMPUTE_START" in _timeline(output, PLAIN_MODEL)
    # The core's counters ran on that server only while it was traced, and saw the traced requests' first responses.
    assert "first responses (" in output.split(f"\n{PLAIN_MODEL}: ", 1)[0]
