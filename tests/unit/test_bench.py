"""tools/bench.py's bookkeeping (no engine): baselines, summary, the issue's targets, merging split runs."""

from __future__ import annotations

import asyncio
import json
import os
import random
import selectors
import time
from pathlib import Path

import pytest

from tools.bench import (
    Group,
    SlicedLevels,
    check_generated_tokens,
    close_all,
    level_slices,
    measure,
    profile_level_argument,
    profiled_level,
    py_spy_command,
    requests_for,
    schedule,
    start_groups,
    token_shortfall,
)
from tools.bench_clients import ClientSpec, LevelRun, ProcessPoolRunner, Prompt, Sample, delayed, run_level, split
from tools.bench_paths import baseline_of, engine_groups, turn_order
from tools.bench_results import (
    LevelResult,
    ResultsFile,
    load_runs,
    noise_lines,
    print_table,
    summarize,
    target_lines,
)


def _run(path: str, tokens_per_s: float, concurrency: int = 64, rep: int = 0, ttft: float | None = None):
    ttfts = [ttft] if ttft is not None else []
    return LevelResult(path, 256, concurrency, rep, 8, 1.0, int(tokens_per_s), 2.0, [1.0], ttfts)


def test_streamed_paths_are_held_against_the_streamed_bare_engine():
    assert baseline_of("stream-grpc") == "bare-stream"
    assert baseline_of("vllm-backend-stream") == "bare-stream"
    assert baseline_of("extra-stream:my_model") == "bare-stream"
    assert baseline_of("plain-grpc") == "bare"
    assert baseline_of("vllm-serve") == "bare"


def test_summary_takes_medians_over_repetitions_and_ratios_to_the_right_baseline():
    runs = [_run("bare", v, rep=i) for i, v in enumerate((100, 300, 200))]
    runs += [_run("bare-stream", 400)]
    runs += [_run("plain-grpc", v, rep=i) for i, v in enumerate((150, 190, 170))]
    runs += [_run("stream-grpc", 360)]
    rows = {row["path"]: row for row in summarize(runs)}
    assert rows["bare"]["tokens_per_s"] == 200 and rows["bare"]["reps"] == 3
    assert (rows["plain-grpc"]["tokens_per_s_min"], rows["plain-grpc"]["tokens_per_s_max"]) == (150, 190)
    assert rows["plain-grpc"]["ratio"] == pytest.approx(170 / 200)
    assert rows["stream-grpc"]["ratio"] == pytest.approx(360 / 400)  # against bare-stream, not bare


def test_engine_steps_are_summarized_per_level_and_held_against_the_baselines(capsys):
    def steps(running: float, rate: float) -> dict[str, float]:
        return {"running_mean": running, "steps_per_second": rate}

    runs = [_run("bare", 200, rep=i) for i in range(2)] + [_run("plain-grpc", 180, rep=i) for i in range(2)]
    for run, (running, rate) in zip(runs, [(60, 210), (62, 230), (55, 180), (59, 200)], strict=True):
        run.engine_steps = steps(running, rate)
    runs.append(_run("stream-grpc", 150))  # no --profile figures: not in the engine table
    rows = {row["path"]: row for row in summarize(runs)}
    assert (rows["plain-grpc"]["engine_running_mean"], rows["plain-grpc"]["engine_steps_per_s"]) == (57, 190)
    assert rows["stream-grpc"]["engine_steps_per_s"] is None
    print_table(list(rows.values()))
    engine_table = capsys.readouterr().out.split("the engine's steps over each level", 1)[1]
    lines = {line.split()[0]: line.split() for line in engine_table.splitlines()[2:5] if line.strip()}
    # without vLLM's iteration details, the detail columns stay empty
    assert lines["plain-grpc"][3:] == ["57.0", "190.0", f"{190 / 220:.2f}"] + ["-"] * 14
    assert lines["bare"][5] == "1.00" and "stream-grpc" not in lines


def test_iteration_details_split_decode_steps_from_prefill_steps_in_the_engine_table(capsys):
    def steps(rate: float, prefill: int, decode_rate: float, wait: float) -> dict[str, float]:
        return {
            "running_mean": 60, "steps_per_second": rate, "detailed_steps": 100, "prefill_steps": prefill,
            "decode_steps_per_second": decode_rate, "decode_wait_ms": wait,
        }  # fmt: skip

    bare, ours = _run("bare", 200), _run("plain-grpc", 180)
    bare.engine_steps, ours.engine_steps = steps(220, 4, 230, 1.0), steps(190, 20, 200, 0.5)
    # the trips to and from the EngineCore; a repetition that counted no request leaves intake out
    ours.engine_lags = {"requests": 8, "intake_ms": 12.5, "outputs": 8, "return_ms": 30.25, "handed": 8,
                        "handover_ms": 4.5}  # fmt: skip
    # inside the EngineCore per finished request (the first repetition's results predate the split: left out)
    inside = {"finished": 4, "queue_ms": 1.5, "prefill_ms": 30.0, "token_ms": 7.25}
    second = _run("plain-grpc", 180, rep=1)
    second.engine_steps = ours.engine_steps
    second.engine_lags = {"requests": 0, "intake_ms": 0.0, "outputs": 4, "return_ms": 10.25, **inside}
    rows = {row["path"]: row for row in summarize([bare, ours, second])}
    assert rows["plain-grpc"]["engine_prefill_share"] == pytest.approx(0.2)
    assert (rows["plain-grpc"]["engine_intake_ms"], rows["plain-grpc"]["engine_return_ms"]) == (12.5, 20.25)
    assert (rows["plain-grpc"]["engine_decode_steps_per_s"], rows["plain-grpc"]["engine_decode_wait_ms"]) == (200, 0.5)
    print_table(list(rows.values()))
    engine_table = capsys.readouterr().out.split("the engine's steps over each level", 1)[1]
    line = next(line.split() for line in engine_table.splitlines() if line.startswith("plain-grpc"))
    # prefill share, decode steps/s and its ratio to bare's, the wait, the rest of a decode step (1000/200 - 0.5),
    # the mean trips to and from the EngineCore (median of the repetitions; the hand-over of the one repetition that
    # measured it), and the time inside it
    expected = ["0.20", "200.0", f"{200 / 230:.2f}", "0.50", "4.50", "12.5", "4.5", "20.2", "1.5", "30.0", "7.25"]
    assert line[6:-3] == expected


def test_a_core_with_several_front_ends_shows_its_trips_without_step_counters(capsys):
    bare, ours = _run("bare", 200), _run("plain-grpc", 190)
    bare.engine_steps = {"running_mean": 60, "steps_per_second": 220}
    bare.engine_lags = {"requests": 8, "intake_ms": 20.0, "outputs": 8, "return_ms": 15.0}
    ours.engine_lags = {"requests": 8, "intake_ms": 30.0, "outputs": 8, "return_ms": 10.0}  # no engine_steps
    print_table(summarize([bare, ours]))
    engine_table = capsys.readouterr().out.split("the engine's steps over each level", 1)[1]
    line = next(line.split() for line in engine_table.splitlines() if line.startswith("plain-grpc"))
    assert line[3:] == ["-"] * 8 + ["30.0", "-", "10.0"] + ["-"] * 6


def test_a_core_with_several_front_ends_shows_its_batch_and_prompt_steps_without_rates(capsys):
    """Its front ends count the engine's steps untimed (core/step_stats.py): the batch, the share of steps that
    computed prompt tokens and the wait per step are known, the rates (and the CPU per step from them) are not."""
    bare, ours = _run("bare", 200), _run("plain-grpc", 190)
    bare.engine_steps = {
        "running_mean": 60, "steps_per_second": 220, "detailed_steps": 100, "prefill_steps": 10,
        "decode_steps_per_second": 250.0, "decode_wait_ms": 0.05,
    }  # fmt: skip
    ours.engine_steps = {
        "running_mean": 55, "steps_per_second": None, "detailed_steps": 100, "prefill_steps": 25,
        "decode_steps_per_second": None, "decode_wait_ms": 0.06,
    }  # fmt: skip
    rows = {row["path"]: row for row in summarize([bare, ours])}
    assert rows["plain-grpc"]["engine_steps_per_s"] is None and rows["plain-grpc"]["engine_prefill_share"] == 0.25
    print_table(list(rows.values()))
    engine_table = capsys.readouterr().out.split("the engine's steps over each level", 1)[1]
    line = next(line.split() for line in engine_table.splitlines() if line.startswith("plain-grpc"))
    assert line[3:10] == ["55.0", "-", "-", "0.25", "-", "-", "0.06"] and line[10] == "-"


def _triton_stats(requests: int, executions: int, queue_ms: float, execute_ms: float) -> dict[str, float]:
    """Triton's statistics of one model over a level, as ServerWatch records them (totals over the level)."""
    return {
        "executions": float(executions), "success_count": float(requests), "queue_count": float(requests),
        "queue_ms": queue_ms * requests, "compute_infer_count": float(requests),
        "compute_infer_ms": execute_ms * requests,
    }  # fmt: skip


def test_triton_s_statistics_give_each_model_s_wait_per_request_over_the_repetitions(capsys):
    """Where a request waits before the model's code runs (the plain model at 256 streams: its queue): per model,
    the median over the repetitions of the mean queue and execute time per request, and the requests per execute."""
    reps = [_run("plain-grpc", 190, rep=i) for i in range(3)]
    for run, queue_ms in zip(reps, (15.0, 10.0, 12.0), strict=True):
        run.triton_stats = {"vllm_model": _triton_stats(2048, 2048, queue_ms, 1.5)}
    reps[1].triton_stats["vllm_core"] = _triton_stats(100, 25, 2.0, 1.0)  # batched: 4 requests per execute
    reps[2].triton_stats["vllm_core"] = {"executions": 0.0, "success_count": 0.0}  # not used in that repetition
    bare = _run("bare", 200)  # no Triton: no such table row
    rows = {row["path"]: row for row in summarize([bare, *reps])}
    assert rows["bare"]["triton_models"] == {}
    models = rows["plain-grpc"]["triton_models"]
    assert models["vllm_model"] == {"queue_ms": 12.0, "execute_ms": 1.5, "per_execute": 1.0}
    assert models["vllm_core"] == {"queue_ms": 2.0, "execute_ms": 1.0, "per_execute": 4.0}
    print_table(list(rows.values()))
    table = capsys.readouterr().out.split("Triton's statistics per request of each model", 1)[1]
    lines = [line.split() for line in table.splitlines() if line.startswith(("bare", "plain-grpc"))]
    assert lines == [
        ["plain-grpc", "256", "64", "vllm_core", "2.00", "1.00", "4.00"],
        ["plain-grpc", "256", "64", "vllm_model", "12.00", "1.50", "1.00"],
    ]


def test_targets_say_met_or_not_per_level_and_judge_ttft():
    runs = [
        run
        for rep in range(3)
        for run in (
            _run("bare", 100, 256, rep),
            _run("plain-grpc", 96, 256, rep),
            _run("bare-stream", 100, 256, rep, ttft=0.1),
            _run("stream-grpc", 80, 256, rep, ttft=0.2),
            _run("bare-stream", 10, 1, rep, ttft=0.010),
            _run("stream-grpc", 10, 1, rep, ttft=0.012),
        )
    ]
    lines = target_lines(summarize(runs))
    assert "plain-grpc / bare at 256 tokens x 256: 0.96 of medians (target >= 0.95) met" in lines
    assert "stream-grpc / bare-stream at 256 tokens x 256: 0.80 of medians (target >= 0.9) NOT met" in lines
    assert "TTFT p50 at 256 tokens x 1: +2.0 ms over bare-stream (target <= 5) met" in lines
    assert "TTFT p50 at 256 tokens x 256: 2.00x bare-stream (target <= 1.5) NOT met" in lines


def test_a_target_is_judged_from_three_repetitions_not_fewer():
    """The issue's rule is the median of 3 repetitions: a ratio from fewer is printed, and said to be unjudged."""
    runs = [_paired("bare", 100, "0.0"), _paired("plain-grpc", 99, "0.0")]
    runs += [_paired("bare-stream", 100, "0.0"), _paired("stream-grpc", 70, "0.0")]
    runs += [_run("bare-stream", 10, 1, ttft=0.010), _run("stream-grpc", 10, 1, ttft=0.030)]
    lines = target_lines(summarize(runs))
    assert (
        "plain-grpc / bare at 256 tokens x 256: 0.99 paired (0.99; target >= 0.95) not judged (1 of 3 repetitions)"
        in lines
    )
    assert (
        "stream-grpc / bare-stream at 256 tokens x 256: 0.70 paired (0.70; target >= 0.9)"
        " not judged (1 of 3 repetitions)" in lines
    )
    assert (
        "TTFT p50 at 256 tokens x 1: +20.0 ms over bare-stream (target <= 5) not judged (1 of 3 repetitions)" in lines
    )
    # the second and third repetitions (the third in another command: round 10.0 comes after 2.1, not before it)
    runs += [_paired("bare", 200, "2.1"), _paired("plain-grpc", 180, "2.1")]
    runs += [_paired("bare", 100, "10.0"), _paired("plain-grpc", 97, "10.0")]
    assert "plain-grpc / bare at 256 tokens x 256: 0.97 paired (0.99 0.90 0.97; target >= 0.95) met" in target_lines(
        summarize(runs)
    )


def _paired(path: str, tokens_per_s: float, round_id: str) -> LevelResult:
    run = _run(path, tokens_per_s, 256)
    run.round_id = round_id
    return run


def test_paired_ratio_is_the_median_of_each_rounds_ratio():
    # The machine drifts between rounds: bare 100 then 200. Each round's ratio is 0.96; the ratio of the medians
    # mixes rounds (a third round of ours alone, unpaired, pulls its median up).
    runs = [
        _paired("bare", 100, "0.0"), _paired("plain-grpc", 96, "0.0"),
        _paired("bare", 200, "0.1"), _paired("plain-grpc", 192, "0.1"),
        _paired("plain-grpc", 400, "1.0"),
    ]  # fmt: skip
    rows = {row["path"]: row for row in summarize(runs)}
    assert rows["plain-grpc"]["paired_ratio"] == pytest.approx(0.96)
    assert rows["plain-grpc"]["paired_series"] == {"bare": [pytest.approx(0.96), pytest.approx(0.96)]}
    assert rows["plain-grpc"]["ratio"] == pytest.approx(192 / 150)
    assert rows["bare"]["paired_series"] == {"plain-grpc": [pytest.approx(1 / 0.96)] * 2}
    assert (
        "plain-grpc / bare at 256 tokens x 256: 0.96 paired (0.96 0.96; target >= 0.95)"
        " met (decided: 2 of the 3 repetitions meet it)" in target_lines(list(rows.values()))
    )


@pytest.mark.parametrize(
    ("ours", "verdict"),
    [
        ((90, 97), "not judged (2 of 3 repetitions)"),  # one below, one above: the third decides
        ((90, 93), "NOT met (decided: 2 of the 3 repetitions are below it)"),  # no third can lift the median
        ((96, 99), "met (decided: 2 of the 3 repetitions meet it)"),
    ],
)
def test_two_repetitions_on_one_side_of_a_target_decide_it(ours, verdict):
    """The median of 3 is fixed once 2 of them lie on one side of the target; a split pair is still open."""
    runs = []
    for i, tokens in enumerate(ours):
        runs += [_paired("bare", 100, f"0.{i}"), _paired("plain-grpc", tokens, f"0.{i}")]
    lines = [line for line in target_lines(summarize(runs)) if line.startswith("plain-grpc / bare at")]
    assert len(lines) == 1 and lines[0].endswith(verdict), lines


def test_runs_without_common_rounds_are_not_paired():
    rows = {row["path"]: row for row in summarize([_paired("bare", 100, "0.0"), _paired("plain-grpc", 90, "1.0")])}
    assert rows["plain-grpc"]["paired_ratio"] is None and rows["plain-grpc"]["ratio"] == pytest.approx(0.9)


def test_a_results_file_names_each_run_by_its_command_and_repetition(tmp_path: Path):
    first = ResultsFile(tmp_path / "results.json", merge=False, command="bench a", deployment="d")
    first.add(_run("bare", 100, rep=0))
    first.add(_run("bare", 100, rep=1))
    second = ResultsFile(tmp_path / "results.json", merge=True, command="bench b", deployment="d")
    second.add(_run("bare", 100, rep=0))
    runs = second.document()["runs"]
    assert [(r["rep"], r["round_id"]) for r in runs] == [(0, "0.0"), (1, "0.1"), (2, "1.0")]
    # what the next merged command's schedule goes on from, per level (_run's levels are 256 tokens x 64 streams)
    third = ResultsFile(tmp_path / "results.json", merge=True, command="bench c", deployment="d")
    assert third.repetitions_done({"max_tokens": 256, "concurrency": 64}) == 3
    assert third.repetitions_done({"max_tokens": 64, "concurrency": 64}) == 0


def test_report_judges_a_results_file_without_measuring(tmp_path: Path, capsys, monkeypatch):
    """--report: a run merged over commands (or made by an older bench) printed as this bench judges it."""
    from tools.bench import main

    monkeypatch.setattr("tools.machine_facts.gpus", lambda: [])  # the same on a machine with a GPU

    results = ResultsFile(tmp_path / "results.json", merge=False, command="bench a", deployment="d")
    for rep in range(3):
        results.add(_run("bare", 100, rep=rep))
        results.add(_run("plain-grpc", 90 + rep, rep=rep))
    assert main(["--report", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plain-grpc / bare at 256 tokens x 64: 0.91 paired (0.90 0.91 0.92; target >= 0.95) NOT met" in out
    assert "command 0 ran on: no GPU found;" in out and "interrupts while it ran, per CPU:" in out
    assert "busy while it ran, per CPU, %:" in out and "stolen by the hypervisor, per CPU, %:" in out
    assert (tmp_path / "bench.png").exists()
    assert "GPU SM clock" not in out  # no measurement of this machine's has the GPU's samples
    with pytest.raises(SystemExit, match="no .*results.json"):
        main(["--report", "--out", str(tmp_path / "elsewhere")])


def test_report_lists_the_measurements_whose_gpu_clock_fell(tmp_path: Path, capsys):
    from tools.bench import main

    results = ResultsFile(tmp_path / "results.json", merge=False, command="bench a", deployment="d")
    for rep, median in enumerate((1980, 1980, 700)):
        run = _run("bare", 100, rep=rep)
        run.gpu_clocks = {"samples": 5, "sm_mhz_median": median, "sm_mhz_min": median - 10, "reasons": []}
        results.add(run)
    assert main(["--report", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "GPU SM clock while measuring: median 1980 MHz over 3 measurements, lowest sample 690 MHz" in out
    assert "  bare 256 tokens x 64 rep 3: SM median 700 MHz (lowest 690), no reason given; 100 tok/s" in out


class _Group:
    def __init__(self, *paths: str) -> None:
        self.paths = list(paths)


def _twice(level: dict) -> int:
    return 2


def test_interleaved_schedule_measures_each_level_on_every_path_before_the_next():
    bare, triton = _Group("bare", "bare-stream"), _Group("plain-grpc")
    levels = [{"concurrency": 1}, {"concurrency": 64}]
    measured = schedule([bare, triton], levels, True, _twice)
    order = [(path, rep, level["concurrency"]) for _, path, rep, level in measured]
    assert order[:6] == [
        ("plain-grpc", 0, 1), ("bare", 0, 1), ("bare-stream", 0, 1),
        ("plain-grpc", 0, 64), ("bare", 0, 64), ("bare-stream", 0, 64),
    ]  # fmt: skip
    # the next repetition takes the paths in the reverse order: no path is always first (or last) in the turn
    assert order[6:9] == [("bare-stream", 1, 1), ("bare", 1, 1), ("plain-grpc", 1, 1)]
    assert len(order) == 12
    # a command merged into a file that holds one repetition of level 64 (none of level 1) goes on alternating
    done_before = lambda level: 1 if level["concurrency"] == 64 else 0  # noqa: E731
    merged = schedule([bare, triton], levels, True, lambda level: 1, done_before)
    turn = ["plain-grpc", "bare", "bare-stream"]
    assert [path for _, path, _, _ in merged] == turn + turn[::-1]
    # each measurement comes with its group (a group measures its own paths)
    assert all(path in group.paths for group, path, _, _ in schedule([bare, triton], levels, True, _twice))
    # one after the other: a group's every repetition before the next group starts
    sequential = [(path, rep) for _, path, rep, _ in schedule([bare, triton], levels, False, _twice)]
    assert (
        sequential[:2] == [("bare", 0), ("bare", 0)]
        and sequential[8:] == [("plain-grpc", 0)] * 2 + [("plain-grpc", 1)] * 2
    )


def test_the_turn_puts_each_of_our_paths_beside_its_baseline_and_the_path_it_is_held_against():
    six = ["bare", "bare-stream", "vllm-serve", "vllm-serve-stream", "plain-grpc", "stream-grpc"]
    assert turn_order(six) == ["vllm-serve", "plain-grpc", "bare", "bare-stream", "stream-grpc", "vllm-serve-stream"]
    assert turn_order(["bare-stream", "vllm-backend-stream", "stream-grpc"]) == [
        "bare-stream", "stream-grpc", "vllm-backend-stream",
    ]  # fmt: skip
    # an A/B of our own models: the variant beside the deployment's model, both beside the baseline
    assert turn_order(["bare", "plain-grpc", "extra:entry_plain"]) == ["plain-grpc", "extra:entry_plain", "bare"]
    front_ends = ["bare", "bare-front-ends", "plain-grpc", "bare-stream", "bare-front-ends-stream", "stream-grpc"]
    assert sorted(turn_order(front_ends)) == sorted(front_ends)  # every path once, whatever the mix


def test_the_delayed_bare_path_is_the_bare_workers_and_stands_beside_bare():
    bare, shared, served, triton = engine_groups(["bare", "bare-delayed", "plain-grpc"])
    assert (bare, shared, served, triton) == (["bare", "bare-delayed"], [], [], ["plain-grpc"])
    assert baseline_of("bare-delayed") == "bare"
    assert turn_order(["bare", "bare-delayed"]) == ["bare-delayed", "bare"]
    assert turn_order(["bare", "bare-delayed", "plain-grpc"]) == ["bare-delayed", "plain-grpc", "bare"]


def test_a_delayed_send_holds_each_request_back_by_its_seeded_draw_and_counts_the_hold():
    max_delay, inner_latency = 0.03, 0.002
    sent_after: list[float] = []
    started: list[float] = []

    async def inner(prompt: Prompt, max_tokens: int) -> Sample:
        sent_after.append(time.perf_counter() - started[-1])
        await asyncio.sleep(inner_latency)
        return Sample(inner_latency, inner_latency / 2, max_tokens)

    send = delayed(inner, max_delay, seed=7)

    async def scenario() -> list[Sample]:
        samples = []
        for _ in range(12):  # one at a time: each hold is measured from its own start
            started.append(time.perf_counter())
            samples.append(await send(Prompt([1], "x"), 4))
        return samples

    samples = asyncio.run(scenario())
    rng = random.Random(7)
    draws = [rng.uniform(0.0, max_delay) for _ in range(12)]
    assert len(set(draws)) == 12 and max(draws) <= max_delay
    for draw, waited, sample in zip(draws, sent_after, samples, strict=True):
        assert waited >= draw - 0.001  # the request went out only after its hold
        held = sample.latency - inner_latency
        assert held >= draw - 0.001  # and its latency counts the hold
        assert sample.ttft == pytest.approx(held + inner_latency / 2)
        assert sample.output_tokens == 4


def test_a_results_file_loads_back_for_merging(tmp_path: Path):
    from dataclasses import asdict

    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [asdict(_run("bare", 100)) | {"field_of_a_newer_version": 1}]}))
    (loaded,) = load_runs(results)
    assert loaded.path == "bare" and loaded.tokens_per_second == 100
    assert load_runs(tmp_path / "missing.json") == []


def test_the_results_file_holds_every_level_as_soon_as_it_is_measured(tmp_path: Path):
    # A command stopped by the GPU machine's time limit must keep the levels it finished.
    target = tmp_path / "out" / "results.json"
    results = ResultsFile(target, merge=False, command="bench.py --paths bare", deployment="d.yaml")
    results.add(_run("bare", 100))
    assert [r.path for r in load_runs(target)] == ["bare"]
    results.add(_run("plain-grpc", 90))
    doc = json.loads(target.read_text())
    assert [r["path"] for r in doc["runs"]] == ["bare", "plain-grpc"]
    assert [row["ratio"] for row in doc["summary"] if row["path"] == "plain-grpc"] == [pytest.approx(0.9)]
    assert [c["command"] for c in doc["commands"]] == ["bench.py --paths bare"]
    assert not list(target.parent.glob("*.partial"))


def test_a_merged_command_keeps_the_earlier_runs_and_numbers_its_repetitions_after_theirs(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("tools.machine_facts.gpus", lambda: ["NVIDIA H200, 143771 MiB, 580.159.04"])
    target = tmp_path / "results.json"
    first = ResultsFile(target, merge=True, command="first", deployment="d.yaml")
    first.add(_run("bare", 100, rep=0))
    first.add(_run("bare", 110, rep=1))
    second = ResultsFile(target, merge=True, command="second", deployment="d.yaml")
    second.add(_run("bare", 120, rep=0))
    second.add(_run("plain-grpc", 90, rep=0))
    runs = load_runs(target)
    assert [(r.path, r.rep) for r in runs] == [("bare", 0), ("bare", 1), ("bare", 2), ("plain-grpc", 0)]
    commands = json.loads(target.read_text())["commands"]
    assert [c["command"] for c in commands] == ["first", "second"]
    # each command with the machine it ran on, the interrupts and each CPU's time while it ran (tools/machine_facts.py)
    for command in commands:
        assert command["machine"]["cpus"]["count"] > 0 and len(command["interrupts"]["per_cpu"]) > 0
        cpus = len(command["cpu_time"]["busy_percent"])
        assert cpus == len(command["cpu_time"]["steal_percent"]) == len(command["interrupts"]["per_cpu"])
        assert command["machine"]["gpus"] == ["NVIDIA H200, 143771 MiB, 580.159.04"]  # as machine_facts found it
    # Without --merge the file starts over.
    ResultsFile(target, merge=False, command="third", deployment="d.yaml").add(_run("bare", 1))
    assert [(r.path, r.rep) for r in load_runs(target)] == [("bare", 0)]


def test_a_repetition_split_over_commands_by_levels_numbers_like_one(tmp_path: Path):
    # A repetition of every level can outlast one command on the GPU machine: its levels then go to two commands
    # (--levels 1,16 and --levels 64,256), and the next repetition's levels are numbered 1, not 2.
    target = tmp_path / "results.json"
    for command, levels in (("a", (1, 16)), ("b", (64, 256)), ("c", (1, 16)), ("d", (64, 256))):
        results = ResultsFile(target, merge=True, command=command, deployment="d.yaml")
        for concurrency in levels:
            results.add(_run("bare", 100, concurrency=concurrency, rep=0))
    runs = load_runs(target)
    assert sorted((r.concurrency, r.rep) for r in runs) == [(c, rep) for c in (1, 16, 64, 256) for rep in (0, 1)]
    assert all(row["reps"] == 2 for row in json.loads(target.read_text())["summary"])


def test_merging_refuses_runs_of_a_path_measured_with_another_client(tmp_path: Path):
    from dataclasses import asdict

    target = tmp_path / "results.json"
    ResultsFile(target, merge=True, command="first", deployment="d.yaml").add(_run("stream-grpc", 100))
    assert [r.client for r in load_runs(target)] == ["grpc-stream"]
    # the same client: merged; a path measured with a stream per request is another client
    ResultsFile(target, merge=True, command="second", deployment="d.yaml", paths=["stream-grpc", "bare"])
    ResultsFile(target, merge=True, command="third", deployment="d.yaml", paths=["stream-grpc-per-request"])
    # runs written before clients were recorded (stream-grpc then opened a stream per request)
    older = asdict(_run("stream-grpc", 100)) | {"client": None}
    target.write_text(json.dumps({"runs": [older, asdict(_run("bare", 100)) | {"client": "in-process"}]}))
    with pytest.raises(SystemExit, match="stream-grpc measured with client None .* this command's is grpc-stream"):
        ResultsFile(target, merge=True, command="fourth", deployment="d.yaml", paths=["bare", "stream-grpc"])
    ResultsFile(target, merge=True, command="fifth", deployment="d.yaml", paths=["bare"])  # bare's client is the same
    ResultsFile(target, merge=False, command="sixth", deployment="d.yaml", paths=["stream-grpc"])  # starts over


def test_bare_delayed_runs_record_their_hold_and_merging_refuses_another(tmp_path: Path):
    target = tmp_path / "results.json"
    ResultsFile(target, merge=True, command="first", deployment="d.yaml", bare_delay_ms=60).add(
        _run("bare-delayed", 100)
    )
    assert [r.client for r in load_runs(target)] == ["in-process-delayed-60ms"]
    ResultsFile(target, merge=True, command="second", deployment="d.yaml", paths=["bare-delayed"], bare_delay_ms=60)
    with pytest.raises(SystemExit, match="bare-delayed measured with client in-process-delayed-60ms .* in-process-d"):
        ResultsFile(target, merge=True, command="third", deployment="d.yaml", paths=["bare-delayed"], bare_delay_ms=30)
    # the other paths' clients do not depend on it
    ResultsFile(target, merge=True, command="fourth", deployment="d.yaml", bare_delay_ms=30).add(_run("bare", 100))
    assert [r.client for r in load_runs(target)] == ["in-process-delayed-60ms", "in-process"]


def test_merging_refuses_runs_of_another_stagger(tmp_path: Path):
    from dataclasses import replace

    target = tmp_path / "results.json"
    ResultsFile(target, merge=True, command="first", deployment="d.yaml").add(_run("bare", 100))
    ResultsFile(target, merge=True, command="second", deployment="d.yaml")  # the same workload: merged
    with pytest.raises(SystemExit, match="runs with --stagger-seconds 0.0, this command's is 0.5"):
        ResultsFile(target, merge=True, command="third", deployment="d.yaml", stagger_seconds=0.5)
    staggered = ResultsFile(target, merge=False, command="fourth", deployment="d.yaml", stagger_seconds=0.5)
    staggered.add(replace(_run("bare", 100), stagger_seconds=0.5))
    assert [r.stagger_seconds for r in load_runs(target)] == [0.5]
    ResultsFile(target, merge=True, command="fifth", deployment="d.yaml", stagger_seconds=0.5)
    with pytest.raises(SystemExit, match="runs with --stagger-seconds 0.5, this command's is 0.0"):
        ResultsFile(target, merge=True, command="sixth", deployment="d.yaml")


def test_each_triton_path_gets_its_client_address_and_model():
    from types import SimpleNamespace

    from tools.bench import triton_client_specs
    from tools.bench_clients import ClientSpec

    setup = SimpleNamespace(plain="vllm_model", streaming="vllm_model_stream")
    server = SimpleNamespace(grpc_url="h:8001", http_url="h:8000")
    paths = ["plain-grpc", "plain-http", "stream-grpc", "stream-grpc-per-request", "extra:m1", "extra-stream:m2"]
    assert triton_client_specs(paths, setup, server) == {
        "plain-grpc": ClientSpec("grpc-infer", "h:8001", "vllm_model"),
        "plain-http": ClientSpec("http-generate", "h:8000", "vllm_model"),
        "stream-grpc": ClientSpec("grpc-stream", "h:8001", "vllm_model_stream"),
        "stream-grpc-per-request": ClientSpec("grpc-stream-per-request", "h:8001", "vllm_model_stream"),
        "extra:m1": ClientSpec("grpc-infer", "h:8001", "m1"),
        "extra-stream:m2": ClientSpec("grpc-stream", "h:8001", "m2"),
    }


def test_an_unknown_path_is_refused_before_anything_starts(tmp_path: Path, capsys):
    import tools.bench as bench

    with pytest.raises(SystemExit):
        bench.main(["--paths", "bare,stream-grcp", "--out", str(tmp_path)])
    assert "unknown path stream-grcp" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_a_run_that_dies_midway_keeps_its_levels_and_exits_non_zero(tmp_path: Path, monkeypatch, capsys):
    import tools.bench as bench

    async def dies_after_one_level(args, on_result, done, reps_of):
        on_result(_run("bare", 100))
        raise RuntimeError("Server disconnected")

    monkeypatch.setattr(bench, "run_all", dies_after_one_level)
    assert bench.main(["--paths", "bare,vllm-serve", "--out", str(tmp_path)]) == 1
    assert [r.path for r in load_runs(tmp_path / "results.json")] == ["bare"]
    assert "stopped early (RuntimeError: Server disconnected)" in capsys.readouterr().out


def test_a_run_that_measures_nothing_leaves_an_earlier_results_file_as_it_was(tmp_path: Path, monkeypatch):
    import tools.bench as bench

    ResultsFile(tmp_path / "results.json", merge=False, command="earlier", deployment="d.yaml").add(_run("bare", 100))
    before = (tmp_path / "results.json").read_text()

    async def dies_at_once(args, on_result, done, reps_of):
        raise RuntimeError("vllm serve exited")

    monkeypatch.setattr(bench, "run_all", dies_at_once)
    assert bench.main(["--paths", "vllm-serve", "--out", str(tmp_path)]) == 1
    assert (tmp_path / "results.json").read_text() == before


def test_requests_per_level_are_four_per_stream_within_the_bounds():
    assert [requests_for(c, quick=False) for c in (1, 16, 64, 256)] == [8, 64, 256, 512]
    assert requests_for(256, quick=False, max_requests=1024) == 1024  # four waves at 256 streams
    assert requests_for(256, quick=True, max_requests=1024) == 256
    assert requests_for(1, quick=False, max_requests=4) == 8  # never below 8
    assert requests_for(64, quick=False, max_requests=4096, per_stream=16) == 1024  # longer levels
    assert requests_for(1, quick=False, min_requests=32) == 32  # enough first tokens at one stream
    assert requests_for(64, quick=False, min_requests=32) == 256  # no effect where the streams give more


def test_a_level_spreads_over_client_processes_evenly_and_completely():
    assert split(256, 4) == [64, 64, 64, 64]
    assert split(10, 4) == [3, 3, 2, 2]
    assert sum(split(513, 4)) == 513


def test_py_spy_records_the_named_level_or_the_largest_and_refuses_one_not_measured():
    levels = [{"concurrency": c, "max_tokens": m} for m in (64, 256) for c in (1, 64, 256)]
    assert profiled_level(levels, profile_level_argument("64x64")) == {"concurrency": 64, "max_tokens": 64}
    assert profiled_level(levels, None) == {"concurrency": 256, "max_tokens": 256}
    with pytest.raises(SystemExit, match="16x64 is not one of this run's levels"):
        profiled_level(levels, (16, 64))
    with pytest.raises(Exception, match="STREAMSxTOKENS"):
        profile_level_argument("64")


def test_also_deployment_is_rendered_into_the_same_repository_and_a_name_clash_is_refused(tmp_path: Path):
    """--also-deployment: a variant of the deployment served by the same server, under its own model names."""
    from repo_render import DEFAULT_CONFIG
    from tools.bench import bench_repository

    doc = DEFAULT_CONFIG.read_text().replace("model: ../models/", f"model: {DEFAULT_CONFIG.parent.parent}/models/")
    variant = tmp_path / "variant.yaml"
    variant.write_text(
        doc + "names: {plain: v_model, streaming: v_stream, core: v_core, generate: v_generate,"
        " preprocess: v_pre, postprocess: v_post}\ncore: {postprocess_in_sender: true}\n"
    )
    setup = bench_repository(tmp_path / "out", DEFAULT_CONFIG, {}, [variant])
    models = {p.name for p in setup.repo.iterdir()}
    assert {"vllm_model", "vllm_model_stream", "vllm_core", "v_model", "v_stream", "v_core", "v_post"} <= models
    assert (setup.plain, setup.streaming) == ("vllm_model", "vllm_model_stream")  # the first deployment's
    clash = tmp_path / "clash.yaml"
    clash.write_text(doc)
    with pytest.raises(SystemExit, match="models of the same names in two deployments: generate, postprocess"):
        bench_repository(tmp_path / "out2", DEFAULT_CONFIG, {}, [clash])


def test_preprocess_model_stream_adds_the_streaming_ensemble_through_the_preprocess_model_to_the_same_core(
    tmp_path: Path,
):
    """--preprocess-model-stream NAME: with core.preprocess_threads the streaming ensemble is the core alone; NAME is
    the same ensemble as it would be without them (preprocess model -> the same core), so both share one engine."""
    from repo_render import DEFAULT_CONFIG
    from tools.bench import bench_repository

    doc = DEFAULT_CONFIG.read_text().replace("model: ../models/", f"model: {DEFAULT_CONFIG.parent.parent}/models/")
    in_core = tmp_path / "in-core.yaml"
    in_core.write_text(doc + "core: {postprocess_in_sender: true, preprocess_threads: 2}\n")
    setup = bench_repository(tmp_path / "out", in_core, {}, preprocess_model_stream="via_preprocess")
    steps = [
        line.split('"')[1]
        for line in (setup.repo / "via_preprocess" / "config.pbtxt").read_text().splitlines()
        if "model_name:" in line
    ]
    assert steps == ["preprocess", "vllm_core"]
    assert (setup.repo / "via_preprocess" / "1").is_dir() and not (
        setup.repo / "via_preprocess" / "1" / "model.py"
    ).exists()
    assert 'model_name: "preprocess"' not in (setup.repo / "vllm_model_stream" / "config.pbtxt").read_text()
    with pytest.raises(SystemExit, match="a model of that name exists"):  # it would replace that model's files
        bench_repository(tmp_path / "out3", in_core, {}, preprocess_model_stream="preprocess")
    with pytest.raises(SystemExit, match="needs a deployment with core.preprocess_threads"):
        bench_repository(tmp_path / "out2", DEFAULT_CONFIG, {}, preprocess_model_stream="via_preprocess")
    # A plain path that does not use the preprocess model either (the entry model runs the stage): the deployment
    # renders none, so the added ensemble's first step comes with it.
    alone = tmp_path / "alone.yaml"
    alone.write_text(in_core.read_text() + "entry: plain-bls\n")
    assert not (bench_repository(tmp_path / "out4", alone, {}).repo / "preprocess").exists()
    setup = bench_repository(tmp_path / "out5", alone, {}, preprocess_model_stream="via_preprocess")
    assert (setup.repo / "preprocess" / "config.pbtxt").is_file() and (setup.repo / "preprocess" / "1").is_dir()


class _JumpingSelector(selectors.DefaultSelector):
    """Instead of waiting for the next timer, moves the loop's clock to it: timed coroutines run exactly on schedule,
    however busy the machine (a real clock let a loaded CI machine run a sleep 54 ms late)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None):  # type: ignore[override]
        if timeout:
            self.now += timeout
        return super().select(0)


class _VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jumping = _JumpingSelector()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now


def _request_starts(stagger: float, phase: float = 0.0) -> list[float]:
    """When each request of 4 streams x 2 requests started, relative to the level's start (a send takes 0.5 s)."""
    starts: list[float] = []

    async def send(prompt: Prompt, max_tokens: int) -> Sample:
        starts.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.5)
        return Sample(0.5, None, max_tokens)

    async def level() -> float:
        begun = asyncio.get_running_loop().time()
        await run_level(send, [Prompt([1], "a")], 4, 8, 16, stagger=stagger, phase=phase)
        return begun

    with asyncio.Runner(loop_factory=_VirtualClockLoop) as runner:
        begun = runner.run(level())
    return [t - begun for t in starts]


def test_each_sample_knows_the_wave_it_went_out_in():
    durations = iter([0.55, 0.1, 0.1, 0.1, 0.1, 0.1])  # by the order the requests go out

    async def send(prompt: Prompt, max_tokens: int) -> Sample:
        await asyncio.sleep(next(durations))
        return Sample(0.1, None, max_tokens)

    async def level() -> list[Sample]:
        samples, _ = await run_level(send, [Prompt([1], "a")], 2, 6, 16)
        return samples

    with asyncio.Runner(loop_factory=_VirtualClockLoop) as runner:
        samples = runner.run(level())
    # 2 streams, 6 requests: requests 0-1 go out in wave 0, 2-3 in wave 1, 4-5 in wave 2 (i // streams); listed as
    # they finished, the first request's (0.55 s) last, after the other stream's five
    assert [s.wave for s in samples] == [0, 1, 1, 2, 2, 0]


def test_slices_waves_are_numbered_on_over_the_level():
    from tools.bench import numbered_on

    assert numbered_on([[0, 0, 1, 1], [0, 0, 1, 1, 2]]) == [0, 0, 1, 1, 2, 2, 3, 3, 4]
    assert numbered_on([[], [0, 1]]) == [0, 1]


def test_stagger_spreads_the_streams_first_requests_over_it():
    # by default a level's streams start at once
    assert _request_starts(0.0) == pytest.approx([0.0] * 4 + [0.5] * 4, abs=1e-6)
    # 4 streams over 0.4 s; each stream's second request follows its first, none takes a slot before its stream began
    assert _request_starts(0.4) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8], abs=1e-6)
    # the second of two client processes sharing a level: its streams (0.1, 0.3, 0.5, 0.7) fall between the first
    # one's; the last request takes the first slot freed (1.1, after the request that started at 0.6)
    assert _request_starts(0.8, phase=0.5) == pytest.approx([0.1, 0.3, 0.5, 0.6, 0.7, 0.8, 1.0, 1.1], abs=1e-6)


def test_a_one_stream_level_in_slices_takes_the_turn_once_per_slice():
    bare, triton = _Group("bare", "bare-stream"), _Group("plain-grpc", "stream-grpc")
    levels = [{"concurrency": 1, "requests": 10}, {"concurrency": 64, "requests": 512}]
    scheduled = schedule([bare, triton], levels, True, lambda level: 1, one_stream_slices=4)
    order = [(path, level) for _, path, _, level in scheduled]
    turn = ["plain-grpc", "bare", "bare-stream", "stream-grpc"]
    one_stream = [path for path, level in order if level["concurrency"] == 1]
    # the turn once per slice, reversed every other slice: each path first as often as last
    assert one_stream == turn + turn[::-1] + turn + turn[::-1]
    for path in turn:  # each path's slices share out the level's requests and know the whole
        slices = [level for measured, level in order if measured == path and level["concurrency"] == 1]
        assert [level["requests"] for level in slices] == [3, 3, 2, 2]
        assert [level["slice"] for level in slices] == [0, 1, 2, 3]
        assert {(level["slices"], level["level_requests"]) for level in slices} == {(4, 10)}
    # a loaded level is measured whole, once per path, as without slices
    assert [level["requests"] for path, level in order if level["concurrency"] == 64] == [512] * 4
    # fewer requests than slices: no empty slice
    few = schedule([triton], [{"concurrency": 1, "requests": 2}], True, lambda level: 1, one_stream_slices=4)
    assert [level["requests"] for _, _, _, level in few] == [1, 1, 1, 1] and few[0][3]["slices"] == 2
    # not interleaved: no turn to slice, the levels whole
    assert len(schedule([bare, triton], levels, False, lambda level: 1, one_stream_slices=4)) == 8


def test_a_level_of_several_streams_in_slices_of_whole_waves():
    bare, triton = _Group("bare", "bare-stream"), _Group("plain-grpc", "stream-grpc")
    levels = [{"concurrency": 1, "requests": 10}, {"concurrency": 256, "requests": 2048}]
    order = schedule([bare, triton], levels, True, lambda level: 1, wave_slices=4)
    turn = ["plain-grpc", "bare", "bare-stream", "stream-grpc"]
    # the one-stream level whole (--one-stream-slices is its own option), then the turn once per slice of 2 waves
    assert [(path, level["requests"]) for _, path, _, level in order[:4]] == [(path, 10) for path in turn]
    loaded = [(path, level) for _, path, _, level in order[4:]]
    assert [path for path, _ in loaded] == turn + turn[::-1] + turn + turn[::-1]
    for path in turn:
        slices = [level for measured, level in loaded if measured == path]
        assert [level["requests"] for level in slices] == [512] * 4  # 2 waves of 256 each
        assert [level["slice"] for level in slices] == [0, 1, 2, 3]
        assert {(level["slices"], level["level_requests"]) for level in slices} == {(4, 2048)}
    # whole waves only: 5 waves of 64 in 2 slices of 3 and 2 waves; requests beyond whole waves go with the last
    assert [level["requests"] for level in level_slices({"concurrency": 64, "requests": 320}, waves=2)] == [192, 128]
    assert [level["requests"] for level in level_slices({"concurrency": 64, "requests": 330}, waves=2)] == [192, 138]
    # more slices than waves: one wave each, no empty slice; less than a wave, or one slice: the level whole
    assert [level["requests"] for level in level_slices({"concurrency": 16, "requests": 48}, waves=8)] == [16] * 3
    assert level_slices({"concurrency": 16, "requests": 12}, waves=4) == [{"concurrency": 16, "requests": 12}]
    assert level_slices({"concurrency": 16, "requests": 64}) == [{"concurrency": 16, "requests": 64}]
    # both options at once: each applies to its own levels
    both = schedule([triton], levels, True, lambda level: 1, one_stream_slices=2, wave_slices=2)
    assert [(level["concurrency"], level["requests"]) for _, _, _, level in both] == [(1, 5)] * 4 + [(256, 1024)] * 4


def test_only_a_paths_first_slice_of_a_level_warms_up():
    class Recording:
        def __init__(self) -> None:
            self.warm: list[bool] = []

        async def prepare(self, prompts, concurrency, total, max_tokens, stagger, warm=False):
            self.warm.append(warm)

        async def run(self, progress=None):
            return LevelRun([Sample(0.1, 0.05, 64)], 0.1, 0.0)

    runner = Recording()
    whole = {"concurrency": 1, "max_tokens": 64, "requests": 32, "stagger": 0.0}
    for level in [whole, *level_slices(whole, 4), {**whole, "concurrency": 16, "requests": 64}]:
        asyncio.run(measure(runner, [], level, None, None))
    # the whole level and the first slice warm up; the later slices find the path warm
    assert runner.warm == [False, False, True, True, True, False]


def test_a_measurement_says_when_it_ran_by_the_wall_clock():
    # the GPU's samples (tools/gpu_clocks.py) are taken by the wall clock in the benchmark's process, the bare
    # engine's measurements in its worker's: each measurement's span is the requests' time, not the warm-up's
    class Timed:
        async def prepare(self, *args, **kwargs):
            await asyncio.sleep(0.2)

        async def run(self, progress=None):
            self.started = time.time()
            await asyncio.sleep(0.1)
            return LevelRun([Sample(0.1, 0.05, 64)], 0.1, 0.0)

    runner = Timed()
    level = {"concurrency": 1, "max_tokens": 64, "requests": 1, "stagger": 0.0}
    before = time.time()
    measured = asyncio.run(measure(runner, [], level, None, None))
    start, end = measured["span"]
    assert before + 0.2 <= start <= runner.started and end - start >= 0.1


def test_a_paths_slices_add_up_to_one_measurement_of_the_level():
    sliced = SlicedLevels()
    level = {"concurrency": 1, "max_tokens": 64, "requests": 2, "slices": 2, "level_requests": 4}

    def part(wall: float, latencies: list[float], cpu: float | None, gpu_samples: list | None = None) -> dict:
        ttfts = [latency / 10 for latency in latencies]
        tokens = 64 * len(latencies)
        return {"wall": wall, "output_tokens": tokens, "cpu_seconds": cpu, "latencies": latencies, "ttfts": ttfts,
                "waves": list(range(len(latencies))), "client_cpu_seconds": 0.5,
                "gpu_samples": gpu_samples or []}  # fmt: skip

    assert sliced.complete("bare", 0, level, part(0.2, [0.1, 0.1], 1.0, ["a"])) is None  # a slice to come
    assert sliced.complete("plain-grpc", 0, level, part(0.3, [0.15, 0.15], None)) is None  # another path's
    whole = sliced.complete("bare", 0, {**level, "requests": 2}, part(0.4, [0.2, 0.2], 2.0, ["b", "c"]))
    assert whole == {
        "wall": pytest.approx(0.6), "output_tokens": 256, "cpu_seconds": pytest.approx(3.0),
        "latencies": [0.1, 0.1, 0.2, 0.2], "ttfts": [0.01, 0.01, 0.02, 0.02], "client_cpu_seconds": 1.0,
        "waves": [0, 1, 2, 3],  # each slice's waves numbered on from the slice before's
        "gpu_samples": ["a", "b", "c"],  # the GPU's samples of every slice, summed up by the caller
    }  # fmt: skip
    del whole["gpu_samples"]
    result = LevelResult("bare", 64, 1, 0, 4, **whole)
    assert result.tokens_per_second == pytest.approx(256 / 0.6)  # the path's tokens over its own time, all slices
    # a CPU reading missing in one slice is missing for the level, not a part of it
    assert sliced.complete("plain-grpc", 0, level, part(0.3, [0.15, 0.15], 1.0))["cpu_seconds"] is None
    # a level measured whole passes through
    whole_level = {"concurrency": 64, "max_tokens": 64, "requests": 8}
    measured = part(1.0, [0.5], 1.0)
    assert sliced.complete("bare", 0, whole_level, measured) is measured


def test_slices_need_the_turn_of_interleave(tmp_path: Path, capsys):
    import tools.bench as bench

    for option in ("--one-stream-slices", "--wave-slices"):
        for options in ([option, "4"], [option, "4", "--interleave", "--profile"]):
            with pytest.raises(SystemExit):
                bench.main(["--paths", "bare", *options, "--out", str(tmp_path)])
            assert f"{option} takes the turn of --interleave" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            bench.main(["--paths", "bare", option, "4", "--interleave", "--cpu-busy", "--out", str(tmp_path)])
        assert f"not with {option}" in capsys.readouterr().err
    # waves out of step (--stagger-seconds) are not waves to slice
    with pytest.raises(SystemExit):
        bench.main(["--paths", "bare", "--wave-slices", "4", "--interleave", "--stagger-seconds", "0.5"])
    assert "--wave-slices slices waves" in capsys.readouterr().err


def test_fill_to_measures_only_the_repetitions_each_level_lacks(tmp_path: Path):
    target = tmp_path / "results.json"
    stopped = ResultsFile(target, merge=False, command="stopped by its time limit", deployment="d.yaml")
    for rep in range(3):  # level 64 complete
        stopped.add(_run("bare", 100, 64, rep))
        stopped.add(_run("plain-grpc", 95, 64, rep))
    for rep in range(2):  # level 256 cut in its second round: bare measured, plain-grpc not
        stopped.add(_run("bare", 100, 256, rep))
    stopped.add(_run("plain-grpc", 95, 256, 0))
    merged = ResultsFile(target, merge=True, command="--fill-to 3", deployment="d.yaml")
    paths = ["bare", "plain-grpc"]
    level = {"max_tokens": 256}
    lacking = [merged.repetitions_lacking({**level, "concurrency": c}, paths, 3) for c in (1, 64, 256)]
    assert lacking == [3, 0, 2]  # none yet; complete; the cut round again on both paths, then the third
    # the schedule measures each level that many times, in turn, and no level more
    bare, triton = _Group("bare"), _Group("plain-grpc")
    levels = [{"concurrency": c} for c in (1, 64, 256)]
    reps = dict(zip((1, 64, 256), lacking, strict=True))
    order = schedule([bare, triton], levels, True, lambda level: reps[level["concurrency"]])
    assert [(c["concurrency"], rep) for _, path, rep, c in order if path == "bare"] == [
        (1, 0),
        (256, 0),
        (1, 1),
        (256, 1),
        (1, 2),
    ]
    assert len(order) == 2 * 5


def _levels_from_the_command_line(tmp_path: Path, monkeypatch, key: str, *options: str) -> list:
    """`key` of every level bench.main would run with --levels 1,16 --max-tokens 64 and `options`."""
    import tools.bench as bench

    seen = []

    async def records_the_levels(args, on_result, done, reps_of):
        seen.extend(level[key] for level in bench.levels_for(args))

    monkeypatch.setattr(bench, "run_all", records_the_levels)
    bench.main(["--paths", "bare", "--levels", "1,16", "--max-tokens", "64", *options, "--out", str(tmp_path)])
    return seen


def test_stagger_reaches_every_level_from_the_command_line(tmp_path: Path, monkeypatch):
    assert _levels_from_the_command_line(tmp_path, monkeypatch, "stagger", "--stagger-seconds", "0.5") == [0.5, 0.5]


def test_min_requests_reaches_every_level_from_the_command_line(tmp_path: Path, monkeypatch):
    assert _levels_from_the_command_line(tmp_path, monkeypatch, "requests", "--min-requests", "32") == [32, 64]


def test_fill_to_reaches_the_schedule_from_the_command_line(tmp_path: Path, monkeypatch, capsys):
    import tools.bench as bench

    with pytest.raises(SystemExit):  # without --merge there is nothing to count
        bench.main(["--paths", "bare", "--fill-to", "3", "--out", str(tmp_path)])
    assert "--fill-to counts the repetitions in OUT/results.json: it needs --merge" in capsys.readouterr().err
    earlier = ResultsFile(tmp_path / "results.json", merge=False, command="first", deployment="d")
    earlier.add(_run("bare", 100, 16, 0))
    planned = []

    async def plans_the_repetitions(args, on_result, done, reps_of):
        planned.extend(reps_of(level) for level in bench.levels_for(args))

    monkeypatch.setattr(bench, "run_all", plans_the_repetitions)
    argv = ["--paths", "bare", "--levels", "1,16", "--max-tokens", "256", "--fill-to", "3", "--merge"]
    bench.main([*argv, "--out", str(tmp_path)])
    assert planned == [3, 2]
    assert "repetitions to measure: 256 tokens x 1: 3, 256 tokens x 16: 2" in capsys.readouterr().err
    # once every level has its repetitions the command starts nothing
    for rep in range(3):
        earlier.add(_run("bare", 100, 1, rep))
    for rep in (1, 2):
        earlier.add(_run("bare", 100, 16, rep))
    planned.clear()
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    assert planned == [] and "every level has as many repetitions already" in capsys.readouterr().out


def test_the_same_engines_two_paths_per_round_give_the_machines_own_spread():
    # bare and bare-stream are one engine: their ratio per round is what the machine adds to any paired ratio.
    runs = [
        _paired("bare", 100, "0.0"), _paired("bare-stream", 98, "0.0"),
        _paired("bare", 200, "0.1"), _paired("bare-stream", 120, "0.1"),
        _paired("bare", 300, "1.0"),  # no bare-stream in that round: not a pair
        _paired("plain-grpc", 90, "0.0"),
    ]  # fmt: skip
    assert noise_lines(runs) == ["one engine, bare-stream / bare at 256 tokens x 256, per round: 0.98 / 0.60"]
    assert noise_lines([_run("bare", 100, 256), _run("bare-stream", 90, 256)]) == []  # not interleaved: no rounds


def test_the_results_file_keeps_the_spread_next_to_the_targets(tmp_path: Path):
    results = ResultsFile(tmp_path / "results.json", merge=False, command="bench.py", deployment="d", paths=["bare"])
    for path, value in (("bare", 100), ("bare-stream", 90)):
        results.add(_run(path, value, 256))
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["noise"] == ["one engine, bare-stream / bare at 256 tokens x 256, per round: 0.90"]


def test_background_load_runs_only_inside_its_block_and_on_this_process_cpus():
    from tools.bench import busy_processes
    from tools.triton_server import process_table

    with busy_processes(1) as spin, busy_processes(1, "memory") as memory, busy_processes(1, "objects") as objects:
        load = spin.processes + memory.processes + objects.processes
        time.sleep(0.5)  # long enough for a load whose code does not run to exit
        assert all(p.poll() is None for p in load)
        assert all(os.sched_getaffinity(p.pid) == os.sched_getaffinity(0) for p in load)
        # the memory load's target buffer is written over and over: 256 MiB resident or more once its copies start
        deadline = time.monotonic() + 30
        while (rss_mib := [process_table()[p.pid].rss_mib for p in load])[1] < 256 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rss_mib[0] < 64 and rss_mib[1] >= 256, rss_mib
    assert all(p.poll() is not None for p in load)  # killed and reaped: nothing keeps a CPU busy after the run


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_paused_background_load_takes_no_cpu_until_it_runs_again():
    """--background-load-alternate pauses the busy loops in even repetitions: stopped, they use no CPU at all."""
    from tools.bench import busy_processes

    with busy_processes(2) as load:
        assert load.running == 2
        load.run(False)
        assert load.running == 0
        time.sleep(0.2)  # a SIGSTOP is delivered asynchronously
        assert all(_process_state(p.pid) == "T" for p in load.processes)
        ticks = [_cpu_ticks(p.pid) for p in load.processes]
        time.sleep(0.5)
        assert [_cpu_ticks(p.pid) for p in load.processes] == ticks
        load.run(True)
        assert load.running == 2
        time.sleep(0.5)
        assert all(_process_state(p.pid) != "T" for p in load.processes)
        assert sum(_cpu_ticks(p.pid) for p in load.processes) > sum(ticks)
    assert all(p.poll() is not None for p in load.processes)  # a paused process is killed and reaped too


def test_load_lines_pair_each_loaded_repetition_with_the_unloaded_one_before_it():
    from tools.bench_results import load_lines

    def run(path: str, rep: int, tps: float, busy: int, command: int = 0) -> LevelResult:
        result = _run(path, tps, 256)
        result.rep, result.round_id, result.background_load = rep, f"{command}.{rep}", busy
        return result

    results = [
        run("bare", 0, 100, 0),
        run("bare", 1, 80, 4),
        run("bare", 2, 110, 0),
        run("bare", 3, 99, 4),
        run("bare", 4, 100, 0),  # unpaired: no loaded repetition after it
        run("bare", 1, 50, 4, command=1),  # its unloaded repetition is not in the file
        run("plain-grpc", 0, 90, 0),
        run("plain-grpc", 1, 90, 4),
        run("bare-stream", 0, 90, 4),  # a whole-run load (no alternation): nothing to pair
        run("bare-stream", 1, 90, 4),
    ]
    assert load_lines(results) == [
        "bare at 256 tokens x 256, loaded / unloaded per pair: 0.80 / 0.90 (median 0.85)",
        "plain-grpc at 256 tokens x 256, loaded / unloaded per pair: 1.00 (median 1.00)",
    ]


def test_background_load_starts_after_the_bench_left_the_engines_cpus(tmp_path: Path, monkeypatch):
    """The busy loops inherit the bench's CPUs: started before it is placed, one could share the EngineCore's CPU."""
    import contextlib
    from types import SimpleNamespace

    import tools.bench as bench

    events: list[str] = []
    setup = SimpleNamespace(engine_env={}, engine_cpus=[0], other_engine_cpus=[])
    monkeypatch.setattr(bench, "bench_repository", lambda *args: setup)
    monkeypatch.setattr(bench, "pin_process", lambda pid, cpus: events.append(f"pin {sorted(cpus)}"))

    @contextlib.contextmanager
    def busy(count, kind):
        events.append(f"load {count} {kind}")
        yield []

    async def measure(args, got_setup, on_result, done, load, reps_of):
        assert got_setup is setup
        events.append("measure")

    monkeypatch.setattr(bench, "busy_processes", busy)
    monkeypatch.setattr(bench, "measure_all", measure)
    args = SimpleNamespace(
        out=tmp_path,
        deployment=None,
        variables={},
        also_deployment=[],
        variant=[],
        preprocess_model_stream=None,
        entry_plain=None,
        vllm_backend=None,
        paths=["bare"],
        background_load=3,
        background_load_kind="memory",
    )
    asyncio.run(bench.run_all(args, lambda result: None, lambda level: 0, lambda level: 1))
    others = sorted(os.sched_getaffinity(0) - {0})
    assert events == [f"pin {others}", "load 3 memory", "measure"]
    # a variant's engine CPUs beside the deployment's (here the deployment's loop unplaced): the bench leaves them too
    events.clear()
    setup.engine_cpus, setup.other_engine_cpus = [], [0]
    asyncio.run(bench.run_all(args, lambda result: None, lambda level: 0, lambda level: 1))
    assert events == [f"pin {others}", "load 3 memory", "measure"]


def test_the_variants_engine_cpus_are_known_to_the_bench(tmp_path: Path):
    from repo_render import DEFAULT_CONFIG
    from tools.bench import bench_repository

    variants = [["c1_", "core.engine_cpus=[1]"], ["c0_", "core.engine_cpus=[0]"], ["u_", "core.engine_cpus=[]"]]
    setup = bench_repository(tmp_path / "out", DEFAULT_CONFIG, {}, variants=variants)
    assert (setup.engine_cpus, setup.other_engine_cpus) == ([], [0, 1])
    assert {"c1_vllm_core", "c0_vllm_core", "u_vllm_core"} <= {p.name for p in setup.repo.iterdir()}


def test_entry_plain_adds_the_plain_entry_model_on_the_same_core(tmp_path: Path) -> None:
    """--entry-plain NAME: the plain path as `entry: plain-bls` serves it (one Python model running the stages, the core
    by BLS) beside the plain ensemble, calling the same core (here one of two front ends)."""
    import json

    from repo_render import DEFAULT_CONFIG
    from tools.bench import bench_repository

    doc = DEFAULT_CONFIG.read_text().replace("model: ../models/", f"model: {DEFAULT_CONFIG.parent.parent}/models/")
    doc = doc.replace('VLLM_ENABLE_V1_MULTIPROCESSING: "0"', 'VLLM_ENABLE_V1_MULTIPROCESSING: "1"')
    fronts = tmp_path / "front-ends.yaml"
    fronts.write_text(doc + "core: {front_ends: 2, postprocess_in_sender: true}\nhealth: {restart_engine: false}\n")
    setup = bench_repository(tmp_path / "out", fronts, {}, entry_plain="entry_plain")
    model = setup.repo / "entry_plain"
    assert "EntryModel" in (model / "1" / "model.py").read_text()
    settings = json.loads((model / "1" / "settings.json").read_text())
    assert settings["core_model"] == "vllm_core" and settings["stream"] is False and settings["watch_cancels"] is False
    assert set(json.loads((model / "1" / "stages.json").read_text())) == {"preprocess", "postprocess"}
    assert "decoupled: true" not in (model / "config.pbtxt").read_text()
    assert 'platform: "ensemble"' in (setup.repo / "vllm_model" / "config.pbtxt").read_text()  # the ensemble stays
    with pytest.raises(SystemExit, match="a model of that name exists"):
        bench_repository(tmp_path / "out2", fronts, {}, entry_plain="generate")
    plain_bls = tmp_path / "plain-bls.yaml"
    plain_bls.write_text(fronts.read_text() + "entry: plain-bls\n")
    with pytest.raises(SystemExit, match="needs a deployment with entry: ensemble or plain-core"):
        bench_repository(tmp_path / "out3", plain_bls, {}, entry_plain="entry_plain")
    # beside entry: plain-core's plain model (the core's adapter), calling the same core
    plain_core = tmp_path / "plain-core.yaml"
    plain_core.write_text(fronts.read_text() + "entry: plain-core\n")
    setup = bench_repository(tmp_path / "out4", plain_core, {}, entry_plain="entry_plain")
    assert "EntryModel" in (setup.repo / "entry_plain" / "1" / "model.py").read_text()
    assert "CoreModel" in (setup.repo / "vllm_model" / "1" / "model.py").read_text()


def test_a_path_that_generates_fewer_tokens_than_asked_is_named_with_its_counts():
    assert token_shortfall("stream-grpc", 64, [64] * 16) is None
    problem = token_shortfall("vllm-backend-stream", 64, [64, 17, 64, 3, 17])
    assert problem is not None
    assert problem.startswith("vllm-backend-stream generated 3, 17 tokens in 3 of 5 requests with max_tokens 64")


def test_the_token_check_asks_every_served_path_at_every_max_tokens_and_stops_at_a_shortfall(monkeypatch, capsys):
    import tools.bench as bench

    asked: list[tuple[str, int, int]] = []

    async def counts(spec: ClientSpec, prompts: list[Prompt], max_tokens: int, concurrency: int) -> list[int]:
        asked.append((spec.model, max_tokens, concurrency))
        return [max_tokens - 1 if spec.model == "short" else max_tokens for _ in prompts]

    monkeypatch.setattr(bench, "generated_tokens", counts)
    prompts = [Prompt([1], "a"), Prompt([2], "b")]
    specs = {"plain-grpc": ClientSpec("grpc-infer", "h:1", "plain"), "vllm-serve": ClientSpec("openai", "h:2", "v")}
    levels = [{"max_tokens": m, "concurrency": c} for m in (8, 32) for c in (1, 4)]
    asyncio.run(check_generated_tokens(specs, prompts, levels))
    # every path at every max_tokens, at most the largest level's concurrency at once
    assert asked == [("plain", 8, 4), ("plain", 32, 4), ("v", 8, 4), ("v", 32, 4)]
    err = capsys.readouterr().err
    assert "plain-grpc generated max_tokens (8, 32) for each of 2 prompts" in err and "vllm-serve generated" in err

    specs["stream-grpc"] = ClientSpec("grpc-stream", "h:1", "short")
    with pytest.raises(RuntimeError, match="token check: stream-grpc generated 7 tokens in 2 of 2 requests"):
        asyncio.run(check_generated_tokens(specs, prompts, levels))


def test_a_client_pool_whose_processes_are_gone_still_closes():
    # `timeout` signals the benchmark's whole process group: its client processes die with it, and the pool's close
    # (on the run's way out) finds their pipes closed
    pool = ProcessPoolRunner(ClientSpec("grpc-infer", "127.0.0.1:1", "m"), 2)
    for process in pool._processes:
        process.terminate()
        process.join(timeout=30)
    assert not any(process.is_alive() for process in pool._processes)
    asyncio.run(pool.close())


def test_closing_a_run_closes_every_group_and_then_raises_the_first_failure():
    closed: list[str] = []

    def closer(name: str, fails: bool = False):
        async def close() -> None:
            closed.append(name)
            if fails:
                raise BrokenPipeError(name)

        return close

    with pytest.raises(BrokenPipeError, match="triton"):
        asyncio.run(close_all([closer("triton", fails=True), closer("vllm-serve"), closer("bare", fails=True)]))
    assert closed == ["triton", "vllm-serve", "bare"]


def test_the_time_per_step_and_the_prompt_tokens_computed_compare_a_core_with_several_front_ends_too(capsys):
    """Untimed steps (a core with several front ends) have no rate, but a repetition's wall over its steps compares
    the same work on both engines: the same steps in more time are slower steps. So do the prompt tokens the model
    computed per request and the prefix cache's hits: the same prompts should cost both engines alike."""
    bare = [_run("bare", 200, rep=i) for i in range(3)]
    ours = [_run("plain-grpc", 180, rep=i) for i in range(3)]
    walls, counts = [7.3, 7.6, 7.9, 8.5, 8.6, 8.0], [586, 581, 590, 588, 586, 500]
    for run, wall, count in zip(bare + ours, walls, counts, strict=True):
        run.wall = wall
        run.engine_steps = {"running_mean": 224, "steps": count, "steps_per_second": None}
    ours[2].engine_steps = {"running_mean": 224, "steps": 0, "steps_per_second": None}  # no step counted: left out
    for run, computed, hits in zip(ours[:2], (160, 240), (600, 500), strict=True):  # 8 requests a repetition
        run.engine_steps.update(computed_prompt_tokens=computed, cache_queries=1000, cache_hits=hits)
    rows = {row["path"]: row for row in summarize(bare + ours)}
    assert rows["bare"]["engine_step_ms"] == pytest.approx(7600 / 581)
    assert rows["plain-grpc"]["engine_step_ms"] == pytest.approx((8500 / 588 + 8600 / 586) / 2)
    print_table(list(rows.values()))
    engine_table = capsys.readouterr().out.split("the engine's steps over each level", 1)[1]
    line = next(line.split() for line in engine_table.splitlines() if line.startswith("plain-grpc"))
    assert line[-3] == f"{(8500 / 588 + 8600 / 586) / 2:.2f}" and line[4] == "-"
    assert rows["plain-grpc"]["engine_prompt_computed"] == pytest.approx(25) and line[-2:] == ["25", "0.55"]
    assert rows["bare"]["engine_prompt_computed"] is None  # counted without iteration details: unknown, not 0


def test_a_cores_steps_are_scaled_to_the_levels_own_tokens_when_its_intervals_reach_before_the_level():
    """A core logs an interval per front end every CORE_STATS_SECONDS, so the first ones also count some of its work
    before the level: the steps (and prompt tokens) counted are scaled by the level's tokens over those generated."""
    ours = _run("plain-grpc", 180)
    ours.wall, ours.output_tokens = 6.0, 131072
    ours.engine_steps = {"running_mean": 220, "steps": 612, "steps_per_second": None}  # untimed: a core's
    ours.engine_steps.update(generation_tokens=133856, computed_prompt_tokens=27300)
    share = 131072 / 133856
    assert ours.engine_share() == pytest.approx(share)
    assert ours.level_steps() == pytest.approx(612 * share)
    row = summarize([ours])[0]
    assert row["engine_step_ms"] == pytest.approx(6000 / (612 * share))
    assert row["engine_prompt_computed"] == pytest.approx(27300 * share / 8)
    # the bare engine counts the level alone; a count above the level's tokens is never scaled up
    bare = _run("bare", 200)
    bare.engine_steps = {"steps": 540, "generation_tokens": bare.output_tokens}
    assert bare.engine_share() == 1.0 and bare.level_steps() == 540
    bare.engine_steps = {"steps": 540, "generation_tokens": bare.output_tokens // 2}
    assert bare.engine_share() == 1.0
    # no steps counted, or no generated tokens logged (older results): as counted
    assert _run("bare", 200).level_steps() is None
    bare.engine_steps = {"steps": 540}
    assert bare.level_steps() == 540


def test_py_spy_samples_only_the_gil_holder_when_asked(tmp_path: Path):
    target = tmp_path / "stub.txt"
    plain = py_spy_command("py-spy", 4242, 8.0, target)
    gil = py_spy_command("py-spy", 4242, 8.0, target, gil=True)
    assert "--gil" not in plain
    assert gil.count("--gil") == 1 and [a for a in gil if a != "--gil"] == plain
    # the target process, the file and the duration, each after its flag
    assert plain[plain.index("--pid") + 1] == "4242"
    assert plain[plain.index("-o") + 1] == str(target)
    assert plain[plain.index("-d") + 1] == "8"


def _recording_groups(log: list[str], fail: str | None = None):
    """A group's launch (its process started: logged) and start (waiting for it, as a server's start awaits its
    health: logged at its beginning and end), as tools/bench.py's run gives them to start_groups."""

    async def launch(group: str) -> None:
        log.append(f"launch {group}")

    async def start(group: str) -> None:
        log.append(f"begin {group}")
        await asyncio.sleep(0.01)
        if group == fail:
            raise RuntimeError(f"{group} did not start")
        log.append(f"end {group}")

    return launch, start


def test_parallel_starts_start_the_first_engine_alone_then_launch_the_others_before_waiting_for_them():
    log: list[str] = []
    asyncio.run(start_groups(["bare", "serve", "triton"], *_recording_groups(log), together=True))
    # the first alone (it fills the compile cache the others read), then every other process started, then each
    # waited for in turn in this one task
    assert log == [
        "begin bare",
        "end bare",
        "launch serve",
        "launch triton",
        "begin serve",
        "end serve",
        "begin triton",
        "end triton",
    ]


def test_without_parallel_starts_each_engine_starts_after_the_one_before():
    log: list[str] = []
    asyncio.run(start_groups(["bare", "serve", "triton"], *_recording_groups(log), together=False))
    assert log == ["begin bare", "end bare", "begin serve", "end serve", "begin triton", "end triton"]


def test_a_failed_parallel_start_is_raised_with_the_later_groups_launched_for_the_run_to_close():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="serve did not start"):
        asyncio.run(start_groups(["bare", "serve", "triton"], *_recording_groups(log, fail="serve"), together=True))
    assert log == ["begin bare", "end bare", "launch serve", "launch triton", "begin serve"]


def test_every_kind_of_group_launches_its_own_process():
    # --parallel-starts launches each group before waiting for it: a group without a launch of its own would be
    # started only when waited for, one after the other again (as `vllm serve` was, unnoticed, at first)
    from typing import get_args

    for group in get_args(Group):
        assert "launch" in vars(group), group.__name__


def test_parallel_starts_need_interleave(capsys):
    from tools.bench import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--parallel-starts", "--paths", "bare"])
    assert "--parallel-starts starts every engine before the first level: it needs --interleave" in (
        capsys.readouterr().err
    )
