"""tools/request_cycles.py: a stream's time per request, split into the requests' latency and the time between."""

from __future__ import annotations

import json
import lzma
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.bench_results import LevelResult
from tools.request_cycles import cycle_of, cycles, main


def _run(
    path: str, wall: float, latencies: list[float], concurrency: int = 4, requests: int = 8, **extra: object
) -> LevelResult:
    return LevelResult(path, 64, concurrency, 0, requests, wall, 64 * requests, None, latencies=latencies, **extra)


def test_the_cycle_is_wall_times_streams_over_requests_and_between_is_what_latency_leaves():
    # 4 streams, 8 requests in 2.0 s: each stream spent 1.0 s per request, 0.75 of it inside the requests
    cycle = cycle_of(_run("bare", 2.0, [0.5] * 4 + [1.0] * 4))
    assert cycle is not None
    assert cycle.cycle == pytest.approx(1.0)
    assert cycle.latency == pytest.approx(0.75)
    assert cycle.between == pytest.approx(0.25)
    assert (cycle.p10, cycle.p90) == (0.5, 1.0)


def test_a_level_without_latencies_has_no_cycle():
    assert cycle_of(_run("bare", 2.0, [])) is None


def test_a_sliced_level_is_its_slices_added_up_and_kept_apart_from_whole_ones(tmp_path: Path, capsys):
    # 2 slices of 4 requests each at 4 streams, 1.2 s each: 2.4 s for 8 requests, a 1.2 s cycle
    sliced = _run("bare", 2.4, [1.0] * 8, slices=2)
    cycle = cycle_of(sliced)
    assert cycle is not None and cycle.cycle == pytest.approx(1.2) and cycle.between == pytest.approx(0.2)
    whole = _run("bare", 2.0, [0.9] * 8)
    assert set(cycles([sliced, whole], None, min_streams=4)) == {(64, 4, 0.0, 2), (64, 4, 0.0, 1)}
    file = tmp_path / "results.json"
    file.write_text(json.dumps({"runs": [asdict(sliced), asdict(whole)]}))
    assert main([str(file), "--min-streams", "4"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 4 streams\n  bare                     cycle 1000 " in out
    assert "64 tokens x 4 streams, in 2 slices\n  bare                     cycle 1200 " in out


def test_cycles_group_rounds_per_level_and_path_and_keep_out_of_step_levels_apart():
    runs = [
        _run("bare", 2.0, [0.9] * 8),
        _run("plain-grpc", 2.4, [1.18] * 8),
        _run("bare", 2.2, [1.0] * 8),
        _run("bare", 3.0, [1.4] * 8, stagger_seconds=0.7),
        _run("bare", 0.5, [0.5], concurrency=1, requests=1),  # fewer streams than asked for
        _run("bare", 9.0, [4.0] * 8, background_load=4),  # not the workload the others measured
    ]
    found = cycles(runs, None, min_streams=4)
    assert set(found) == {(64, 4, 0.0, 1), (64, 4, 0.7, 1)}
    assert [round(c.between, 3) for c in found[(64, 4, 0.0, 1)]["bare"]] == [0.1, 0.1]
    assert [round(c.between, 3) for c in found[(64, 4, 0.0, 1)]["plain-grpc"]] == [0.02]
    assert set(cycles(runs, ["plain-grpc"], min_streams=4)[(64, 4, 0.0, 1)]) == {"plain-grpc"}


def test_it_prints_each_paths_rounds_in_ms(tmp_path: Path, capsys):
    doc = {"runs": [asdict(_run("bare", 2.0, [0.9] * 8)), asdict(_run("plain-grpc", 2.4, [1.18] * 8))]}
    file = tmp_path / "results.json.xz"
    file.write_bytes(lzma.compress(json.dumps(doc).encode()))
    assert main([str(file), "--min-streams", "4"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 4 streams\n" in out
    assert "  bare                     cycle 1000  latency 900  between 100  p10-p90 900-900" in out
    assert "  plain-grpc               cycle 1200  latency 1180  between 20  p10-p90 1180-1180" in out
    assert main([str(file), "--paths", "vllm-serve"]) == 1
    assert "no level with its requests' latencies matched" in capsys.readouterr().err


def test_outside_the_batch_is_the_share_of_streams_not_in_it_times_the_cycle(tmp_path: Path, capsys):
    # 4 streams, a 1.0 s cycle, 3 of them in the engine's batch on average: each stream 0.25 s a cycle outside it
    profiled = _run("plain-grpc", 2.0, [0.9] * 8, engine_steps={"running_mean": 3.0})
    cycle = cycle_of(profiled)
    assert cycle is not None and cycle.outside == pytest.approx(0.25)
    unprofiled = cycle_of(_run("bare", 2.0, [0.9] * 8))
    assert unprofiled is not None and unprofiled.outside is None
    doc = {"runs": [asdict(_run("bare", 2.0, [0.9] * 8)), asdict(profiled)]}
    file = tmp_path / "results.json"
    file.write_text(json.dumps(doc))
    assert main([str(file), "--min-streams", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if "plain-grpc" in line][0].endswith("outside 250")
    assert "outside" not in [line for line in lines if line.startswith("  bare")][0]
