"""tools/latency_parts.py: a path's latency beside a reference's, part by part, in the rounds profiled for both."""

from __future__ import annotations

import json
import lzma
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.bench_results import LevelResult
from tools.latency_parts import differences, main, parts_of


def _lags(intake: float, queue: float, prefill: float, token: float, returned: float) -> dict[str, float]:
    return {
        "requests": 8,
        "intake_ms": intake,
        "outputs": 8,
        "return_ms": returned,
        "finished": 8,
        "queue_ms": queue,
        "prefill_ms": prefill,
        "token_ms": token,
    }


def _run(path: str, round_id: str, latency: float, lags: dict[str, float] | None, **extra: object) -> LevelResult:
    return LevelResult(
        path, 65, 64, 0, 8, 1.0, 520, None, latencies=[latency] * 8, engine_lags=lags, round_id=round_id, **extra
    )


def test_a_rounds_parts_are_the_engines_times_and_the_tokens_after_the_first():
    parts = parts_of(_run("bare", "0.0", 0.400, _lags(8.0, 0.5, 25.0, 5.5, 4.5)))
    assert parts is not None
    # 65 tokens: 64 after the first at 5.5 ms each; the first token's time holds the queue
    assert parts.tokens == pytest.approx(352.0)
    assert parts.first_token == pytest.approx(25.5)
    assert parts.latency == pytest.approx(400.0)
    assert parts.columns == pytest.approx((400.0, 8.0, 25.5, 352.0, 4.5))


def test_a_round_not_profiled_or_without_finished_requests_has_no_parts():
    assert parts_of(_run("bare", "0.0", 0.4, None)) is None
    assert parts_of(_run("bare", "0.0", 0.4, {**_lags(8.0, 0.5, 25.0, 5.5, 4.5), "finished": 0})) is None


def test_rounds_are_paired_by_round_within_a_file_and_levels_kept_apart():
    bare = _lags(8.0, 0.5, 25.0, 5.0, 5.0)
    plain = _lags(13.0, 0.5, 27.0, 5.5, 3.0)
    first = [
        _run("bare", "0.0", 0.360, bare),
        _run("plain-grpc", "0.0", 0.400, plain),
        _run("bare", "0.1", 0.350, bare),  # plain-grpc not profiled in this round: no pair
        _run("plain-grpc", "0.1", 0.420, None),
        _run("bare", "0.2", 0.360, bare, slices=4),  # sliced: its own level
        _run("plain-grpc", "0.2", 0.390, plain, slices=4),
    ]
    # the same round id in another file is another round
    second = [_run("bare", "0.0", 0.380, bare), _run("plain-grpc", "0.0", 0.370, _lags(10.0, 0.5, 25.0, 4.5, 4.0))]
    found = differences([first, second], "bare", "plain-grpc", min_streams=64)
    assert set(found) == {(65, 64, 0.0, 1), (65, 64, 0.0, 4)}
    whole = found[(65, 64, 0.0, 1)]
    assert [d.ms for d in whole] == [
        pytest.approx((40.0, 5.0, 2.0, 32.0, -2.0)),
        pytest.approx((-10.0, 2.0, 0.0, -32.0, -1.0)),
    ]
    assert [d.token_ratio for d in whole] == pytest.approx([1.1, 0.9])
    assert [d.ms[0] for d in found[(65, 64, 0.0, 4)]] == pytest.approx([30.0])
    # fewer streams than asked for: nothing
    assert differences([first], "bare", "plain-grpc", min_streams=256) == {}


def test_main_prints_each_part_per_round_and_its_median(tmp_path: Path, capsys):
    runs = [
        _run("bare", "0.0", 0.360, _lags(8.0, 0.5, 25.0, 5.0, 5.0)),
        _run("plain-grpc", "0.0", 0.400, _lags(13.0, 0.5, 27.0, 5.5, 3.0)),
    ]
    file = tmp_path / "results.json.xz"
    file.write_bytes(lzma.compress(json.dumps({"runs": [asdict(run) for run in runs]}).encode()))
    assert main([str(file), "--min-streams", "64"]) == 0
    out = capsys.readouterr().out
    assert "plain-grpc less bare\n  65 tokens x 64 streams, 1 rounds\n    latency      +40 (+40.0)\n" in out
    assert "    intake       +5.0 (+5.0)\n" in out
    assert "    per token    1.10 (1.100x)\n" in out
    # no streamed rounds: that pair is left out; a pair that matches nothing at all is an error
    assert "stream-grpc" not in out
    assert main([str(file), "--pair", "bare-stream,stream-grpc"]) == 1
