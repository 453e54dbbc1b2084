"""tools/pool_rounds.py: a pair's paired ratio over every round of several runs, per level."""

from __future__ import annotations

import json
import lzma
import math
import statistics
from dataclasses import asdict
from pathlib import Path

import pytest

from tools.bench_results import LevelResult
from tools.pool_rounds import by_speed, level_mean, main, pooled_over_levels, pooled_ratios


def _run(
    path: str, tokens: int, round_id: str, concurrency: int = 64, max_tokens: int = 64, stagger: float = 0.0
) -> dict:
    run = LevelResult(
        path, max_tokens, concurrency, 0, 8, 1.0, tokens, None, round_id=round_id, turn_index=0, stagger_seconds=stagger
    )
    return asdict(run)


def _doc(*runs: dict) -> dict:
    return {"commands": [{"command": "bench.py --interleave --paths bare,plain-grpc"}], "runs": list(runs)}


FIRST = _doc(
    _run("bare", 100, "0.0"), _run("plain-grpc", 90, "0.0"),
    _run("bare", 100, "0.1"), _run("plain-grpc", 120, "0.1"),
    _run("plain-grpc", 10, "0.2"),  # its bare run missing (a time limit): no pair
    _run("bare", 100, "0.0", concurrency=1), _run("plain-grpc", 80, "0.0", concurrency=1),
)  # fmt: skip
SECOND = _doc(
    _run("bare", 200, "0.0"), _run("plain-grpc", 180, "0.0"),
    _run("bare", 200, "0.0", max_tokens=256), _run("plain-grpc", 210, "0.0", max_tokens=256),
)  # fmt: skip


def test_each_round_with_both_paths_gives_one_ratio_per_level_across_files():
    pooled = pooled_ratios([FIRST, SECOND], "bare", "plain-grpc", min_streams=1)
    assert pooled[(64, 64, 0.0)] == pytest.approx([0.9, 1.2, 0.9])
    assert pooled[(64, 1, 0.0)] == pytest.approx([0.8])
    assert pooled[(256, 64, 0.0)] == pytest.approx([1.05])
    # levels of fewer streams only when asked for; the other direction is the inverse
    assert (64, 1, 0.0) not in pooled_ratios([FIRST, SECOND], "bare", "plain-grpc", min_streams=64)
    inverse = pooled_ratios([FIRST], "plain-grpc", "bare", min_streams=64)
    assert inverse[(64, 64, 0.0)] == pytest.approx([1 / 0.9, 1 / 1.2])


def test_rounds_of_streams_out_of_step_pool_apart_from_the_waves_of_the_same_level(tmp_path: Path, capsys):
    staggered = _doc(_run("bare", 100, "0.0", stagger=0.3), _run("plain-grpc", 150, "0.0", stagger=0.3))
    pooled = pooled_ratios([FIRST, staggered], "bare", "plain-grpc", min_streams=64)
    assert pooled[(64, 64, 0.0)] == pytest.approx([0.9, 1.2])
    assert pooled[(64, 64, 0.3)] == pytest.approx([1.5])
    files = [tmp_path / "waves.json", tmp_path / "staggered.json"]
    for file, doc in zip(files, (FIRST, staggered), strict=True):
        file.write_text(json.dumps(doc))
    assert main([str(f) for f in files] + ["--min-streams", "64"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 64 streams: 2 rounds" in out
    assert "64 tokens x 64 streams out of step by 0.3 s: 1 rounds, median 1.500" in out


def test_it_prints_each_levels_rounds_median_range_and_count_below(tmp_path: Path, capsys):
    plain = tmp_path / "first.json"
    plain.write_text(json.dumps(FIRST))
    compressed = tmp_path / "second.json.xz"
    compressed.write_bytes(lzma.compress(json.dumps(SECOND).encode()))
    assert main([str(plain), str(compressed), "--min-streams", "64", "--below", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 64 streams: 3 rounds, median 0.900, 0.90-1.20, 2 below 0.95" in out
    assert "256 tokens x 64 streams: 1 rounds, median 1.050, 1.05-1.05, 0 below 0.95" in out
    assert "x 1 streams" not in out


def test_a_pair_no_round_measured_says_so_and_fails(tmp_path: Path, capsys):
    plain = tmp_path / "first.json"
    plain.write_text(json.dumps(FIRST))
    assert main([str(plain), "--pair", "bare,stream-grpc"]) == 1
    assert "no round measured both bare and stream-grpc" in capsys.readouterr().err


def test_several_pairs_each_get_their_levels_and_each_lists_every_files_rounds(tmp_path: Path, capsys):
    variant = _doc(
        _run("bare", 100, "0.0"), _run("plain-grpc", 90, "0.0"), _run("extra:c15_vllm_model", 99, "0.0"),
        _run("bare", 100, "0.1"), _run("plain-grpc", 100, "0.1"), _run("extra:c15_vllm_model", 95, "0.1"),
    )  # fmt: skip
    files = [tmp_path / "first.json", tmp_path / "variant.json"]
    files[0].write_text(json.dumps(FIRST))
    files[1].write_text(json.dumps(variant))
    argv = [str(f) for f in files] + ["--min-streams", "64", "--each"]
    assert main([*argv, "--pair", "bare,plain-grpc", "--pair", "plain-grpc,extra:c15_vllm_model"]) == 0
    out = capsys.readouterr().out
    assert "plain-grpc / bare per round, pooled over 2 file(s)\n  64 tokens x 64 streams: 4 rounds" in out
    assert "    first.json: 0.90 1.20\n    variant.json: 0.90 1.00\n" in out
    assert "extra:c15_vllm_model / plain-grpc per round" in out
    assert (
        "  64 tokens x 64 streams: 2 rounds, median 1.025, 0.95-1.10, 0 below 0.95\n    variant.json: 1.10 0.95" in out
    )
    assert "first.json: " not in out.split("extra:c15_vllm_model / plain-grpc")[1]  # no round of the pair there
    # one pair of several that no round measured still fails the command, after the others are printed
    assert main([*argv, "--pair", "bare,plain-grpc", "--pair", "bare,stream-grpc"]) == 1
    captured = capsys.readouterr()
    assert "plain-grpc / bare per round" in captured.out
    assert "no round measured both bare and stream-grpc" in captured.err


def test_by_speed_groups_a_levels_rounds_by_both_paths_speed_with_the_ms_a_request_took_longer():
    rates = [(800, 760), (100, 90), (400, 400), (200, 180)]
    slow, fast = by_speed((64, 256, 0.0), rates, groups=2)
    assert (slow.rounds, fast.rounds) == (2, 2)
    assert (slow.slowest, slow.fastest) == pytest.approx((math.sqrt(100 * 90), math.sqrt(200 * 180)))
    assert slow.geometric_mean == pytest.approx(0.9)
    assert fast.geometric_mean == pytest.approx(math.sqrt(0.95))
    # 256 streams x 64 tokens: a request's time is 256 * 64 / tok/s seconds
    per_request = 256 * 64 * 1000
    assert slow.extra_ms == pytest.approx(
        statistics.fmean([per_request * (1 / 90 - 1 / 100), per_request * (1 / 180 - 1 / 200)])
    )
    assert fast.extra_ms == pytest.approx(per_request * (1 / 760 - 1 / 800) / 2)
    # the order goes by both paths' rates: a round whose first path alone ran fast is not the fastest
    lopsided = by_speed((64, 256, 0.0), [(300, 100), (150, 250)], groups=2)
    assert [g.geometric_mean for g in lopsided] == pytest.approx([100 / 300, 250 / 150])
    # more groups than rounds: only the groups that hold a round
    assert len(by_speed((64, 256, 0.0), rates[:1], groups=4)) == 1


def test_by_speed_prints_each_levels_groups_under_the_level(tmp_path: Path, capsys):
    file = tmp_path / "first.json"
    file.write_text(json.dumps(FIRST))
    assert main([str(file), "--min-streams", "64", "--by-speed", "2"]) == 0
    out = capsys.readouterr().out
    level, slow, fast = out.splitlines()[1:4]
    assert level.startswith("  64 tokens x 64 streams: 2 rounds")
    assert (
        slow == "    pair at 95-95 tok/s: 1 rounds, geometric mean 0.900, a request +4551 ms"
    )  # 64 x 64 x 1000 x (1/90 - 1/100)
    assert fast == "    pair at 110-110 tok/s: 1 rounds, geometric mean 1.200, a request -6827 ms"


def test_every_level_together_gives_a_geometric_mean_its_error_and_the_spread_within_a_level():
    levels = [[0.9, 1.1], [0.5, 0.5, 0.5]]  # a level far from the other adds nothing to the spread within a level
    together = pooled_over_levels(levels, threshold=1.0)
    assert together is not None and together.rounds == 5
    logs = [math.log(r) for r in (0.9, 1.1, 0.5, 0.5, 0.5)]
    assert together.geometric_mean == pytest.approx(math.exp(sum(logs) / 5))
    within = math.log(0.9) - (math.log(0.9) + math.log(1.1)) / 2
    assert together.spread == pytest.approx(math.sqrt(2 * within**2 / 3))  # 5 rounds less 2 level means
    error = statistics.stdev(logs) / math.sqrt(5)
    assert (together.low, together.high) == pytest.approx(
        (together.geometric_mean * math.exp(-2 * error), together.geometric_mean * math.exp(2 * error))
    )
    # at a threshold of 1.0 a path exactly as fast is above it in half the rounds, and so is its median of three
    assert together.equal_meets == pytest.approx(0.5)
    # the lower the threshold, the likelier; a spread of nothing always meets it
    assert pooled_over_levels(levels, threshold=0.9).equal_meets > 0.5
    assert pooled_over_levels([[1.0, 1.0], [0.9, 0.9]], threshold=0.95).equal_meets == 1.0
    # one round per level says nothing of the spread within one
    assert pooled_over_levels([[0.9], [1.1], [1.0, 1.2]], threshold=0.95) is None


def test_it_pools_the_waves_levels_together_apart_from_those_out_of_step(tmp_path: Path, capsys):
    staggered = _doc(
        _run("bare", 100, "0.0", stagger=0.3), _run("plain-grpc", 150, "0.0", stagger=0.3),
        _run("bare", 100, "0.1", stagger=0.3), _run("plain-grpc", 130, "0.1", stagger=0.3),
        _run("bare", 100, "0.2", stagger=0.3), _run("plain-grpc", 110, "0.2", stagger=0.3),
    )  # fmt: skip
    files = [tmp_path / "waves.json", tmp_path / "second.json", tmp_path / "staggered.json"]
    for file, doc in zip(files, (FIRST, SECOND, staggered), strict=True):
        file.write_text(json.dumps(doc))
    assert main([str(f) for f in files] + ["--min-streams", "64"]) == 0
    out = capsys.readouterr().out
    waves = pooled_over_levels([[0.9, 1.2, 0.9], [1.05]], threshold=0.95)
    assert f"  waves, 2 level(s) together: 4 rounds, geometric mean {waves.geometric_mean:.3f} (" in out
    meets = f"a path as fast as bare gets a median of 3 rounds >= 0.95 in {100 * waves.equal_meets:.0f} % of levels"
    assert meets in out
    assert "  out of step, 1 level(s) together: 3 rounds, geometric mean " in out


def test_each_level_gets_its_geometric_mean_at_the_pooled_spread_and_each_number_of_streams_its_own(
    tmp_path: Path, capsys
):
    # 64 streams a little below 1, 256 streams well below: the mean of every level together hides which load trails
    rounds = {(64, "0"): 100, (64, "1"): 90, (64, "2"): 95, (256, "0"): 80, (256, "1"): 85, (256, "2"): 75}
    runs = []
    for (streams, round_id), plain in rounds.items():
        runs += [
            _run("bare", 100, round_id, concurrency=streams),
            _run("plain-grpc", plain, round_id, concurrency=streams),
        ]
    doc = _doc(*runs)
    file = tmp_path / "run.json"
    file.write_text(json.dumps(doc))
    assert main([str(file), "--min-streams", "64"]) == 0
    out = capsys.readouterr().out
    spread = pooled_over_levels([[1.0, 0.9, 0.95], [0.8, 0.85, 0.75]], threshold=0.95).spread
    low = level_mean([0.8, 0.85, 0.75], spread)
    assert low[0] == pytest.approx((0.8 * 0.85 * 0.75) ** (1 / 3))
    assert low[1:] == pytest.approx(
        (low[0] * math.exp(-2 * spread / math.sqrt(3)), low[0] * math.exp(2 * spread / math.sqrt(3)))
    )
    assert (
        f"64 tokens x 256 streams: 3 rounds, median 0.800, 0.75-0.85, 3 below 0.95, geometric mean {low[0]:.3f}" in out
    )
    assert f"({low[1]:.3f}-{low[2]:.3f})\n" in out
    at_256 = pooled_over_levels([[0.8, 0.85, 0.75]], threshold=0.95)
    assert f"    waves at 256 streams: 3 rounds, geometric mean {at_256.geometric_mean:.3f}" in out
    assert "    waves at 64 streams: 3 rounds" in out
    # one number of streams in the group: no line per number of streams, only the group's
    file.write_text(json.dumps(_doc(*(r for r in doc["runs"] if r["concurrency"] == 256))))
    assert main([str(file), "--min-streams", "64"]) == 0
    assert "streams: 3 rounds, geometric mean" not in capsys.readouterr().out


def test_profiled_rounds_give_the_engines_mean_batch_and_step_time_apart_from_tok_s(tmp_path: Path, capsys):
    # tok/s per round ~ the batch ratio over the step-time ratio: these two tell an emptier batch from slower steps
    runs = []
    for round_id, (batch, steps, generated) in enumerate([(220, 612, 97), (230, 570, 95), (210, 630, 95)]):
        bare = _run("bare", 100, str(round_id), concurrency=256)  # 100 tokens in 1 s, all counted by its engine
        ours = _run("plain-grpc", 95, str(round_id), concurrency=256)
        bare["engine_steps"] = {"running_mean": 242, "steps": 540, "generation_tokens": 100}
        # the first round's core counted 2 tokens of work before the level: its steps are scaled by 95 / 97
        ours["engine_steps"] = {"running_mean": batch, "steps": steps, "generation_tokens": generated}
        runs += [bare, ours]
    unprofiled = [_run("bare", 100, "9", concurrency=256), _run("plain-grpc", 90, "9", concurrency=256)]
    file = tmp_path / "run.json"
    file.write_text(json.dumps(_doc(*runs, *unprofiled)))
    assert main([str(file), "--min-streams", "64"]) == 0
    out = capsys.readouterr().out
    assert "64 tokens x 256 streams: 4 rounds" in out  # tok/s: every round; the engine's figures: profiled ones
    batch = pooled_over_levels([[220 / 242, 230 / 242, 210 / 242]], threshold=1.0)
    step = pooled_over_levels([[540 / (612 * 95 / 97), 540 / 570, 540 / 630]], threshold=1.0)
    assert (
        f"  the engine, waves, 3 profiled rounds: mean batch {batch.geometric_mean:.3f} ({batch.low:.3f}-"
        f"{batch.high:.3f}), step time {step.geometric_mean:.3f} ({step.low:.3f}-{step.high:.3f})\n" in out
    )
    # no profiled round of the pair: no engine line
    file.write_text(json.dumps(_doc(*unprofiled)))
    assert main([str(file)]) == 0
    assert "the engine" not in capsys.readouterr().out


def test_a_path_measured_with_different_clients_in_different_files_is_noted(tmp_path: Path, capsys):
    def held(ms: float, tokens: int) -> dict:
        return {**_run("bare-delayed", tokens, "0.0"), "client": f"in-process-delayed-{ms:g}ms"}

    docs = {
        "a.json": _doc({**_run("bare", 100, "0.0"), "client": "in-process"}, held(0, 100)),
        "b.json": _doc({**_run("bare", 100, "0.0"), "client": "in-process"}, held(60, 90)),
        "c.json": _doc(_run("bare", 100, "0.0"), {**_run("bare-delayed", 95, "0.0"), "client": None}),  # unrecorded
    }
    for name, doc in docs.items():
        (tmp_path / name).write_text(json.dumps(doc))
    files = [str(tmp_path / name) for name in docs]
    assert main([*files, "--pair", "bare,bare-delayed"]) == 0
    out = capsys.readouterr().out
    assert (
        "  note: bare-delayed was measured with different clients, pooled together here:"
        " in-process-delayed-0ms (1 file(s)), in-process-delayed-60ms (1 file(s))"
    ) in out
    assert "64 tokens x 64 streams: 3 rounds" in out  # still pooled: the note says what was
    assert "note: bare " not in out  # bare's one client (and a file that did not record it) is no note
    # the files of one client: no note
    assert main([files[0], "--pair", "bare,bare-delayed"]) == 0
    assert "note:" not in capsys.readouterr().out
