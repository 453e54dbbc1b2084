"""tools/pair_spread.py: the spread of a paired ratio by the two paths' distance in --interleave's turn."""

from __future__ import annotations

import json
import lzma
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.bench_results import LevelResult
from tools.pair_spread import main, older_turn, squared_deviations


def _run(path: str, tokens: int, round_id: str, turn_index: int | None = None, concurrency: int = 64) -> dict:
    run = LevelResult(path, 64, concurrency, 0, 8, 1.0, tokens, None, round_id=round_id, turn_index=turn_index)
    return asdict(run)


def test_an_older_benchs_turn_is_its_engines_groups_in_turn():
    six = "bench.py --interleave --paths plain-grpc,stream-grpc,bare,bare-stream,vllm-serve,vllm-serve-stream"
    assert older_turn(six) == ["bare", "bare-stream", "vllm-serve", "vllm-serve-stream", "plain-grpc", "stream-grpc"]
    # its Triton group ends with the extra models, in the options' order
    extras = "bench.py --interleave --paths bare,plain-grpc --extra-model a --extra-stream-model b"
    assert older_turn(extras) == ["bare", "plain-grpc", "extra:a", "extra-stream:b"]
    assert older_turn("bench.py --paths bare,plain-grpc") is None  # not interleaved: no turn, no pairs


def test_deviations_pool_by_distance_from_recorded_places_and_rebuilt_ones():
    doc = {
        "commands": [
            {"command": "bench.py --interleave --paths bare,bare-stream,plain-grpc"},  # an older bench
            {"command": "bench.py --interleave --paths bare,plain-grpc"},  # turn_index recorded
        ],
        "runs": [
            _run("bare", 100, "0.0"), _run("bare-stream", 100, "0.0"), _run("plain-grpc", 90, "0.0"),
            _run("bare", 100, "0.1"), _run("bare-stream", 100, "0.1"), _run("plain-grpc", 110, "0.1"),
            _run("plain-grpc", 80, "1.0", 0), _run("bare", 100, "1.0", 1),
            _run("plain-grpc", 100, "1.1", 0), _run("bare", 100, "1.1", 1),
            _run("plain-grpc", 50, "1.2", 0),  # its bare run missing: no pair
            _run("plain-grpc", 50, "1.3", 0, concurrency=16), _run("bare", 100, "1.3", 1, concurrency=16),
        ],
    }  # fmt: skip
    pooled = squared_deviations([doc], min_streams=64)
    spread = math.log(1.1) - math.log(0.9)  # two rounds: each deviates by half of it, times n / (n - 1) = 2
    assert pooled[("bare", "plain-grpc", 2)] == pytest.approx([2 * (spread / 2) ** 2] * 2)
    assert pooled[("bare", "plain-grpc", 1)] == pytest.approx([2 * (math.log(1.25) / 2) ** 2] * 2)
    assert pooled[("bare", "bare-stream", 1)] == pytest.approx([0.0, 0.0])  # the same in both rounds
    assert set(pooled) == {("bare", "plain-grpc", 2), ("bare", "plain-grpc", 1), ("bare", "bare-stream", 1),
                           ("bare-stream", "plain-grpc", 1)}  # fmt: skip
    # levels of fewer streams count only when asked for
    assert len(squared_deviations([doc], min_streams=16)[("bare", "plain-grpc", 1)]) == 2
    assert ("bare", "plain-grpc", 1) in squared_deviations([doc], min_streams=1)


def test_it_reads_results_and_their_compressed_copies(tmp_path: Path, capsys):
    doc = {
        "commands": [{"command": "bench.py --interleave --paths bare,plain-grpc"}],
        "runs": [_run("bare", 100, "0.0", 1), _run("plain-grpc", 90, "0.0", 0),
                 _run("bare", 100, "0.1", 1), _run("plain-grpc", 110, "0.1", 0)],
    }  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(doc))
    (tmp_path / "copy.json.xz").write_bytes(lzma.compress(json.dumps(doc).encode()))
    assert main([str(tmp_path / "results.json"), str(tmp_path / "copy.json.xz")]) == 0
    spread = abs(math.log(1.1) - math.log(0.9)) / math.sqrt(2)
    lines = capsys.readouterr().out.splitlines()
    assert f"  every pair, distance 1: {spread:.3f} (4 rounds)" in lines
    assert f"  bare / plain-grpc, distance 1: {spread:.3f} (4 rounds)" in lines
