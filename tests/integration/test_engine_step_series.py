"""tools/engine_step_series.py on the real (CPU) engine: every generated token of the level is in its per-second
table, and every request finished once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.reliability_helpers import vllm_ipc_sockets
from tools.engine_step_series import main

pytestmark = pytest.mark.server


def test_a_level_step_by_step(tmp_path: Path, capsys):
    sockets_before = vllm_ipc_sockets()
    assert main(["--concurrency", "4", "--requests", "12", "--max-tokens", "8", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "step-series.json").read_text())
    rows = result["seconds"]
    assert sum(row["generated"] for row in rows) == 12 * 8  # the warm-up's steps are not counted
    assert sum(row["finished"] for row in rows) == 12
    assert all(row["batch"] is None or 1 <= row["batch"] <= 4 for row in rows)
    assert sum(row["mixed_steps"] for row in rows) >= 1 and sum(row["steps"] for row in rows) >= 8
    assert "sec steps mixed" in capsys.readouterr().out
    assert vllm_ipc_sockets() <= sockets_before  # its engine's socket files went with its own TMPDIR
