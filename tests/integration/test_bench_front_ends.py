"""tools/bench.py's bare-front-ends paths on the real engine: one EngineCore, started by the benchmark's launcher,
shared by an AsyncLLM client in each of the deployment's `core.front_ends` client processes (as the core's front
ends share theirs), measured beside the bare engine in one command (the levels of several streams in slices of
whole waves); and the bare engine's bare-delayed path."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import pytest

from tests.support import fake_nvidia_smi
from tests.support.bench_deployments import shared_engine_deployment
from tests.support.reliability_helpers import vllm_ipc_sockets
from tools.bench import main

pytestmark = pytest.mark.server

MAX_TOKENS = 8
REQUESTS = 8
DELAY_MS = 400  # bare-delayed's longest hold


def test_the_bare_engine_shared_by_two_front_end_processes(tiny_model, tmp_path: Path, monkeypatch):
    # A stand-in nvidia-smi (this machine has no GPU): the GPU's samples reach the measurements, the bare engine's
    # timed in the worker process and the front ends' in theirs (tools/gpu_clocks.py)
    monkeypatch.setenv("PATH", fake_nvidia_smi.install(tmp_path / "bin"))
    paths = "bare,bare-front-ends,bare-front-ends-stream,bare-delayed"
    args = ["--deployment", str(shared_engine_deployment(tmp_path, tiny_model)), "--paths", paths, "--levels", "1,4"]
    args += ["--max-tokens", str(MAX_TOKENS), "--max-requests", str(REQUESTS), "--min-requests", str(REQUESTS)]
    args += ["--bare-delay-ms", str(DELAY_MS)]
    sockets_before, folders_before = vllm_ipc_sockets(), set(Path(tempfile.gettempdir()).glob("bench-engine-*"))
    # the 4-stream level in 2 slices of 1 wave each (--wave-slices), the paths' turn once per slice
    assert main([*args, "--reps", "1", "--interleave", "--wave-slices", "2", "--out", str(tmp_path / "out")]) == 0
    # the bare worker's and the launcher's engines named their ZMQ sockets in folders of their own, now gone
    assert vllm_ipc_sockets() <= sockets_before
    assert set(Path(tempfile.gettempdir()).glob("bench-engine-*")) <= folders_before
    runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
    assert {(run["path"], run["concurrency"]) for run in runs} == {
        (path, concurrency) for path in paths.split(",") for concurrency in (1, 4)
    }
    for run in runs:
        # every request answered with its tokens, one latency each; TTFT only where the outputs were streamed
        assert run["requests"] == REQUESTS and run["output_tokens"] == REQUESTS * MAX_TOKENS, run["path"]
        assert len(run["latencies"]) == REQUESTS and all(latency > 0 for latency in run["latencies"])
        streamed = run["path"] == "bare-front-ends-stream"
        assert len(run["ttfts"]) == (REQUESTS if streamed else 0), run["path"]
        assert run["slices"] == (2 if run["concurrency"] == 4 else 1), run["path"]
        # not profiled: no engine's statistics to count trips to and from the EngineCore with, so none counted
        assert run["engine_lags"] is None, run["path"]
    # the stand-in's samples inside the measurements, each its reading. Not in every one: a measurement can take less
    # than 100 ms here, and on a loaded CI machine the stand-in may get no CPU for that long (a one-stream `bare`
    # level once got none). The worker's longest (bare-delayed at one stream, its holds alone ~1.5 s) has them, and
    # at least one of the front ends' processes' measurements (their spans are timed there, not in the worker).
    for run in runs:
        clocks = run["gpu_clocks"]
        if clocks is not None:
            assert clocks["samples"] >= 1 and clocks["sm_mhz_median"] == fake_nvidia_smi.SM_MHZ, run["path"]
    longest_in_worker = max((run for run in runs if run["path"] == "bare-delayed"), key=lambda run: run["wall"])
    assert longest_in_worker["gpu_clocks"] is not None and longest_in_worker["wall"] > 1.0
    assert any(run["gpu_clocks"] for run in runs if run["path"].startswith("bare-front-ends"))
    # Each client process's requests got outputs, so each one's client attached to the launcher's engine: at 4
    # streams both processes ran 2 (a client that cannot attach never answers: its level fails)
    client_cpu = {run["concurrency"]: run["client_cpu_seconds"] for run in runs if run["path"] == "bare-front-ends"}
    assert client_cpu[4] > 0
    # bare-delayed: the bare worker's engine, each request held back by the next of its seeded draws (seed 0) first.
    # At one stream the level's 8 requests follow its warm-up request one by one, so their latencies add up to at
    # least the 8 smallest of the first 9 draws.
    rng = random.Random(0)
    draws = sorted(rng.uniform(0.0, DELAY_MS / 1000) for _ in range(REQUESTS + 1))
    (one_stream,) = [run for run in runs if run["path"] == "bare-delayed" and run["concurrency"] == 1]
    assert sum(one_stream["latencies"]) >= sum(draws[:REQUESTS])


def test_profiled_front_ends_count_their_trips_to_and_from_the_engine_core(tiny_model, tmp_path: Path):
    # --profile turns vLLM's statistics on for the launcher's engine as for the bare engine's: each client process,
    # a front end, counts its requests' intake, return and time inside the EngineCore, and the level's counts are
    # the processes' together (tools/latency_parts.py puts them beside the bare engine's)
    paths = "bare,bare-front-ends,bare-front-ends-stream"
    args = ["--deployment", str(shared_engine_deployment(tmp_path, tiny_model)), "--paths", paths, "--levels", "4"]
    args += ["--max-tokens", str(MAX_TOKENS), "--max-requests", str(REQUESTS), "--min-requests", str(REQUESTS)]
    assert main([*args, "--reps", "1", "--profile", "--out", str(tmp_path / "out")]) == 0
    runs = {run["path"]: run for run in json.loads((tmp_path / "out" / "results.json").read_text())["runs"]}
    for path in paths.split(","):
        lags = runs[path]["engine_lags"]
        # every measured request counted once, not the warm-up's: its first output, and its end inside the engine
        assert lags["requests"] == lags["finished"] == REQUESTS, (path, lags)
        assert 0 < lags["intake_ms"] < 10_000 and 0 < lags["return_ms"] < 10_000, (path, lags)
        assert 0 < lags["token_ms"] < 10_000 and 0 < lags["prefill_ms"] < 10_000, (path, lags)
    # a plain request has one (final) output; a streamed one at least one: an output per delta, but vLLM merges the
    # deltas its consumer has not taken yet (on a loaded 2-core machine all 8 tokens of a request can come as one)
    assert runs["bare-front-ends"]["engine_lags"]["outputs"] == REQUESTS
    assert runs["bare-front-ends-stream"]["engine_lags"]["outputs"] >= REQUESTS
