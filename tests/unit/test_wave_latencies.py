"""tools/wave_latencies.py: a level's requests wave by wave, each path's beside a reference path's same wave."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.bench_results import LevelResult
from tools.wave_latencies import client_processes, main, wave_means, waves_by_layout


def _run(path: str, latencies: list[float], concurrency: int = 4, slices: int = 1, **extra: object) -> LevelResult:
    requests = len(latencies)
    return LevelResult(
        path, 64, concurrency, 0, requests, 1.0, 64 * requests, None, latencies=latencies, slices=slices, **extra
    )


def test_the_layout_of_an_in_process_client_is_its_slices_each_in_the_order_finished():
    # 4 streams, 16 requests in 2 slices of 2 whole waves each
    run = _run("bare", [0.1] * 16, slices=2, client="in-process")
    assert waves_by_layout(run, 1) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


def test_the_layout_of_client_processes_is_each_ones_share_in_turn():
    # 4 streams over 2 processes (2 each): a slice of 8 requests is process 0's 4 (waves 0 0 1 1), then process 1's
    run = _run("plain-grpc", [0.1] * 16, slices=2, client="grpc-infer")
    assert waves_by_layout(run, 2) == [0, 0, 1, 1] * 2 + [2, 2, 3, 3] * 2
    # more processes than streams: only as many as there are streams take part (ProcessPoolRunner.prepare)
    assert waves_by_layout(_run("plain-grpc", [0.1] * 4, concurrency=2), 4) == [0, 1, 0, 1]
    # requests beyond whole waves go with the last slice
    assert waves_by_layout(_run("bare", [0.1] * 10, concurrency=4, slices=2), 1) == [0] * 4 + [1] * 4 + [2] * 2


def test_recorded_waves_are_read_as_they_are_and_each_wave_averaged():
    run = _run("bare", [0.1, 0.3, 0.2, 0.4], concurrency=2, waves=[0, 1, 0, 1])
    assert wave_means(run, 1) == {0: pytest.approx(0.15), 1: pytest.approx(0.35)}
    # without them (an older result) the layout: in finishing order, two streams a wave
    assert wave_means(_run("bare", [0.1, 0.3, 0.2, 0.4], concurrency=2), 1) == {
        0: pytest.approx(0.2),
        1: pytest.approx(0.3),
    }


def test_client_processes_come_from_the_command_that_measured_the_round():
    doc = {
        "commands": [
            {"command": "bench.py --interleave --client-processes 4 --levels 64"},
            {"command": "bench.py --client-processes=2"},
            {"command": "bench.py --levels 64"},
        ]
    }
    assert [client_processes(doc, round_id) for round_id in ("0.0", "1.2", "2.0", "7.0")] == [4, 2, 1, 1]


def test_each_paths_waves_against_the_reference_s_same_wave(tmp_path: Path, capsys):
    # one round: bare's two waves 0.20 and 0.30 s; plain's 0.21 and 0.33 (+10, +30 ms); a level out of step is left out
    bare = _run("bare", [0.2] * 4 + [0.3] * 4, client="in-process", round_id="0.0")
    plain = _run("plain-grpc", [0.21] * 4 + [0.33] * 4, client="grpc-infer", round_id="0.0")
    other_round = _run("plain-grpc", [9.0] * 8, client="grpc-infer", round_id="0.1")  # no bare beside it
    out_of_step = _run("plain-grpc", [5.0] * 8, client="grpc-infer", round_id="0.0", stagger_seconds=1.0)
    results = tmp_path / "results.json"
    runs = [asdict(r) for r in (bare, plain, other_round, out_of_step)]
    results.write_text(json.dumps({"commands": [{"command": "bench.py --client-processes 1"}], "runs": runs}))
    assert main([str(results), "--min-streams", "4"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 4 streams" in out
    assert "bare                     2 waves, median wave 250 ms" in out
    assert "plain-grpc               +20 ms (+10..+30) over 2 waves, median wave 270 ms" in out
    # no reference in the file: said, and a failure
    assert main([str(results), "--reference", "vllm-serve", "--min-streams", "4"]) == 1
    assert "no level in waves with vllm-serve" in capsys.readouterr().err
