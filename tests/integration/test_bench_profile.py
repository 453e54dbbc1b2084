"""tools/bench.py --profile on the real engine and server: the bare engine and the core both report the engine's
steps over each level (core/step_stats.py) and the trips to and from the EngineCore (core/engine_lags.py), so a
served path's batch and front end can be put beside the bare engine's; --cpu-busy adds each level's busy CPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.bench import main

pytestmark = pytest.mark.server


def test_profile_reports_the_engines_steps_for_the_bare_engine_and_the_core(tmp_path: Path, capsys):
    # 64 requests a level: long enough (~0.3 s here) for --cpu-busy's readings every 20 ms
    args = ["--paths", "bare,plain-grpc", "--levels", "4", "--max-tokens", "8", "--reps", "1"]
    args += ["--requests-per-stream", "16", "--max-requests", "64"]
    assert main([*args, "--profile", "--cpu-busy", "--out", str(tmp_path)]) == 0
    runs = {run["path"]: run for run in json.loads((tmp_path / "results.json").read_text())["runs"]}
    bare, served = runs["bare"]["engine_steps"], runs["plain-grpc"]["engine_steps"]
    # The bare engine's count covers exactly the level: every request's every token, in steps of at most 4.
    assert bare["generation_tokens"] == runs["bare"]["requests"] * 8
    assert bare["steps"] * 4 >= bare["generation_tokens"] and 1 <= bare["running_max"] <= 4
    # The core's comes from its log, in intervals that may start before the level: at least the level's tokens.
    assert served["generation_tokens"] >= runs["plain-grpc"]["requests"] * 8
    assert 1 <= served["running_max"] <= 4 and served["steps_per_second"] > 0
    # vLLM's iteration details, for both: some steps computed prompt tokens, the others only decoded
    for steps in (bare, served):
        assert 0 < steps["prefill_steps"] < steps["detailed_steps"] <= steps["steps"]
        assert steps["decode_steps_per_second"] > 0 and steps["decode_wait_ms"] >= 0
    # The trips to and from the EngineCore, by its clock: plain requests have one (final) output each
    bare_lags, served_lags = runs["bare"]["engine_lags"], runs["plain-grpc"]["engine_lags"]
    assert bare_lags["requests"] == bare_lags["outputs"] == runs["bare"]["requests"]
    assert (
        served_lags["requests"] >= runs["plain-grpc"]["requests"] and served_lags["outputs"] >= served_lags["requests"]
    )
    for lags in (bare_lags, served_lags):
        assert 0 < lags["intake_ms"] < 10_000 and 0 < lags["return_ms"] < 10_000, lags
        # of the intake, the hand-over until vLLM's front end took the request in (by the wall clock: a little jitter)
        assert lags["handed"] == lags["requests"] and -1 < lags["handover_ms"] <= lags["intake_ms"], lags
    # and the time inside it of every finished request: in the scheduler's queue, until its first token, per token
    assert bare_lags["finished"] == runs["bare"]["requests"]
    assert served_lags["finished"] >= runs["plain-grpc"]["requests"]
    for lags in (bare_lags, served_lags):
        assert 0 <= lags["queue_ms"] < 10_000 and 0 < lags["prefill_ms"] < 10_000 and 0 < lags["token_ms"] < 10_000
    # The core's own counters over the level, as logged: its intake and where the first responses waited
    assert runs["bare"]["core_stats"] is None
    core_lines = runs["plain-grpc"]["core_stats"]
    assert core_lines, "no counter line of the core's over the level"
    assert all(line.startswith("vllm_core stats: ") and "first responses" in line for line in core_lines)
    # --cpu-busy: each level's busy CPUs, read every 20 ms while it ran
    for run in runs.values():
        busy = run["cpu_busy"]
        assert busy["intervals"] >= 1 and busy["cpus"] >= 1 and 0 <= busy["mean_busy"] <= busy["cpus"], busy
    # and vLLM's line per iteration is kept out of the logs
    assert "Iteration(" not in (tmp_path / "triton.log").read_text()
    assert "Iteration(" not in (tmp_path / "bare.log").read_text()
    captured = capsys.readouterr()
    assert "the engine's steps over each level" in captured.out
    # the served path's tokens were counted by the server before it was measured (the bare engine's per request)
    assert "token check: plain-grpc generated max_tokens (8) for each of 16 prompts" in captured.err
