"""The engine-step counters (core/step_stats.py) that put the bare engine and the core side by side under
tools/bench.py --profile: what one interval adds up to, the log line's round trip, and combining intervals."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from core.step_stats import EngineSteps, StepSnapshot, combine, parse_line


def _scheduler(running: int, waiting: int = 0, details: SimpleNamespace | None = None) -> SimpleNamespace:
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, iteration_details=details)


def _details(prompt_tokens: int, elapsed_ms: float, dummy: bool = False) -> SimpleNamespace:
    return SimpleNamespace(num_ctx_tokens=prompt_tokens, elapsed_ms=elapsed_ms, is_dummy=dummy)


def _iteration(generated: int, prompt: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_generation_tokens=generated, num_prompt_tokens=prompt)


def test_a_snapshot_counts_steps_batch_and_tokens_and_the_time_steps_took(monkeypatch):
    clock = [100.0]  # the module's perf_counter, moved by hand: exact on however busy a machine
    monkeypatch.setattr("core.step_stats.time.perf_counter", lambda: clock[0])
    steps = EngineSteps()
    steps.record(_scheduler(4, waiting=2), _iteration(0, prompt=400))  # a prefill step
    clock[0] += 0.02
    steps.record(_scheduler(4), _iteration(4))
    clock[0] += 0.02
    steps.record(_scheduler(0), _iteration(2))  # the last two finished: nothing runs after it
    clock[0] += 0.05  # idle: not the engine's steps' time
    steps.record(None, _iteration(1))  # an output without scheduler statistics is no step
    snap = steps.snapshot()
    assert (snap.steps, snap.running_max, snap.generation_tokens, snap.prompt_tokens) == (3, 4, 7, 400)
    assert snap.running_mean == pytest.approx(8 / 3)
    assert snap.waiting_mean == pytest.approx(2 / 3)
    assert snap.busy_seconds == pytest.approx(0.04)  # the two gaps after steps with requests running, not the idle
    assert snap.seconds == pytest.approx(0.09)
    assert snap.steps_per_second == pytest.approx(3 / snap.busy_seconds)
    after = steps.snapshot()  # counting starts again
    assert (after.steps, after.generation_tokens, after.busy_seconds) == (0, 0, 0.0)
    assert after.steps_per_second == 0.0


def test_records_from_several_threads_are_all_counted():
    steps = EngineSteps()

    def record() -> None:
        for _ in range(1000):
            steps.record(_scheduler(2), _iteration(2))

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    snap = steps.snapshot()
    assert (snap.steps, snap.generation_tokens, snap.running_mean) == (4000, 8000, 2.0)


def test_iteration_details_split_prefill_steps_from_decode_steps(monkeypatch):
    clock = [100.0]  # moved by hand, as above (a real sleep on a loaded machine ran 54 ms late)
    monkeypatch.setattr("core.step_stats.time.perf_counter", lambda: clock[0])
    steps = EngineSteps()
    steps.record(_scheduler(4, details=_details(800, 3.0)), _iteration(0, prompt=800))  # a prefill step
    for _ in range(3):
        clock[0] += 0.01
        steps.record(_scheduler(4, details=_details(0, 0.5)), _iteration(4))  # decode-only
    clock[0] += 0.03
    steps.record(_scheduler(6, details=_details(300, 2.0)), _iteration(4, prompt=300))  # two more arrived
    steps.record(_scheduler(6, details=_details(0, 0.0, dummy=True)), None)  # a dummy iteration is no step of ours
    snap = steps.snapshot()
    assert (snap.steps, snap.detailed_steps, snap.prefill_steps) == (6, 5, 2)
    assert (snap.decode_wait_ms, snap.prefill_wait_ms) == (pytest.approx(0.5), pytest.approx(2.5))
    # the decode steps' busy time is the gaps before them: not the long one before the second prefill step
    assert snap.decode_busy_seconds == pytest.approx(0.03)
    assert snap.busy_seconds == pytest.approx(0.06)
    assert snap.decode_steps_per_second == pytest.approx(3 / snap.decode_busy_seconds)


def test_the_log_line_reads_back_inside_a_triton_log_line():
    snap = StepSnapshot(
        seconds=0.5, busy_seconds=0.412, steps=61, running_mean=255.2, running_max=256, waiting_mean=0.4,
        generation_tokens=15500, prompt_tokens=3200,
    )  # fmt: skip
    line = f"I1123 20:38:27.123 1234 pb_stub.cc:1] vllm_core {snap.describe()}"
    assert parse_line(line) == StepSnapshot(0.5, 0.412, 61, 255.2, 256, 0.4, 15500, 3200)
    detailed = StepSnapshot(0.5, 0.412, 61, 255.2, 256, 0.4, 15500, 3200, 60, 9, 0.301, 0.42, 3.05)
    assert parse_line(f"vllm_core {detailed.describe()}") == detailed
    # a line from before the details (commit 08a3d3b's core) still reads, without them
    old = (
        "vllm_core engine steps: 61 in 0.50 s (0.412 s busy), running mean 255.2 max 256, waiting mean 0.4,"
        " tokens 15500 generated 3200 prompt"
    )
    assert parse_line(old) == StepSnapshot(0.5, 0.412, 61, 255.2, 256, 0.4, 15500, 3200)
    assert parse_line("vllm_core stats: 12 requests/s in 3 execute calls") is None


def test_intervals_combine_weighted_by_their_steps_and_idle_ones_drop_out():
    busy = StepSnapshot(0.5, 0.5, 100, 200.0, 256, 1.0, 20000, 0)
    tail = StepSnapshot(0.5, 0.2, 50, 50.0, 120, 0.0, 2500, 0)
    idle = StepSnapshot(0.5, 0.0, 0, 0.0, 0, 0.0, 0, 0)
    both = combine([busy, idle, tail])
    assert both is not None
    assert (both.steps, both.running_max, both.generation_tokens) == (150, 256, 22500)
    assert both.running_mean == pytest.approx((200 * 100 + 50 * 50) / 150)
    assert both.steps_per_second == pytest.approx(150 / 0.7)
    assert combine([idle]) is None and combine([]) is None
    # the details' means are weighted by the steps of their kind
    first = StepSnapshot(0.5, 0.5, 100, 200.0, 256, 0.0, 20000, 0, 100, 10, 0.4, 1.0, 4.0)
    second = StepSnapshot(0.5, 0.5, 100, 200.0, 256, 0.0, 20000, 0, 100, 30, 0.3, 2.0, 2.0)
    both = combine([first, second])
    assert both is not None and (both.detailed_steps, both.prefill_steps) == (200, 40)
    assert both.decode_busy_seconds == pytest.approx(0.7)
    assert both.decode_wait_ms == pytest.approx((90 * 1.0 + 70 * 2.0) / 160)
    assert both.prefill_wait_ms == pytest.approx((10 * 4.0 + 30 * 2.0) / 40)


def test_front_ends_of_one_engine_count_their_share_of_steps_untimed_and_the_shares_add_up():
    """vLLM hands each step's statistics to one of several front ends, each sees its own requests' tokens: each
    counts untimed, and combined they are the engine's steps, prompt steps, batch and tokens, with no rate."""
    shares = [EngineSteps(timed=False), EngineSteps(timed=False)]
    # six steps of one engine, handed alternately to the two front ends: the first two computed prompt tokens
    for step, (running, prompt) in enumerate([(2, 300), (4, 200), (4, 0), (4, 0), (4, 0), (2, 0)]):
        shares[step % 2].record(_scheduler(running, details=_details(prompt, 1.0)), None)
        time.sleep(0.005)
    for share, generated in zip(shares, (10, 6), strict=True):  # each front end's own requests' tokens
        share.record(None, _iteration(generated))
    snaps = [share.snapshot() for share in shares]
    assert all(not snap.timed and snap.busy_seconds == 0.0 and snap.steps_per_second is None for snap in snaps)
    for snap in snaps:  # the log line says so, and reads back (to its printed precision)
        line = snap.describe()
        read = parse_line(f"vllm_core {line}")
        assert "(untimed)" in line and read is not None and not read.timed and read.describe() == line
    # a third front end got tokens of its requests but none of the steps' statistics: logged and counted all the same
    third = EngineSteps(timed=False)
    third.record(None, _iteration(5))
    tokens_only = third.snapshot()
    assert tokens_only.steps == 0 and tokens_only.counted and not EngineSteps(timed=False).snapshot().counted
    engine = combine([*snaps, tokens_only])
    assert engine is not None and not engine.timed
    assert (engine.steps, engine.detailed_steps, engine.prefill_steps, engine.generation_tokens) == (6, 6, 2, 21)
    assert engine.running_mean == pytest.approx(20 / 6) and engine.running_max == 4
    assert engine.steps_per_second is None and engine.decode_steps_per_second is None
    assert engine.as_dict()["steps_per_second"] is None
    # a timed interval combined with an untimed one has no rate either
    timed = StepSnapshot(0.5, 0.5, 100, 200.0, 256, 0.0, 20000, 0)
    assert combine([timed, snaps[0]]).steps_per_second is None


def test_prompt_tokens_computed_and_the_prefix_caches_hits_are_counted_logged_and_combined():
    """Two engines given the same prompts should compute about as many prompt tokens: the iteration details' context
    tokens say how many the model computed, the prefix cache's lookups how many it already held."""

    def scheduler(running: int, computed: int, queried: int, hits: int) -> SimpleNamespace:
        cache = SimpleNamespace(queries=queried, hits=hits)
        return SimpleNamespace(
            num_running_reqs=running, num_waiting_reqs=0, iteration_details=_details(computed, 1.0),
            prefix_cache_stats=cache,
        )  # fmt: skip

    steps = EngineSteps(timed=False)
    steps.record(scheduler(2, computed=48, queried=800, hits=752), _iteration(0, prompt=800))  # two cached prompts
    steps.record(scheduler(3, computed=400, queried=400, hits=0), _iteration(2, prompt=400))  # one not cached
    steps.record(scheduler(3, computed=0, queried=0, hits=0), _iteration(3))
    steps.record(_scheduler(3), _iteration(3))  # statistics without a prefix cache's (older vLLM): nothing added
    snap = steps.snapshot()
    assert (snap.computed_prompt_tokens, snap.cache_queries, snap.cache_hits) == (448, 1200, 752)
    line = snap.describe()
    read = parse_line(f"vllm_core {line}")
    assert "prompt computed 448 cache hits 752 of 1200" in line and read is not None and read.describe() == line
    assert (read.computed_prompt_tokens, read.cache_queries, read.cache_hits) == (448, 1200, 752)
    other = StepSnapshot(0.5, 0.0, 4, 3.0, 3, 0.0, 8, 400, 4, 1, 0.0, 1.0, 1.0, 400, 400, 0, timed=False)
    both = combine([snap, other])
    assert both is not None and (both.computed_prompt_tokens, both.cache_queries, both.cache_hits) == (848, 1600, 752)
