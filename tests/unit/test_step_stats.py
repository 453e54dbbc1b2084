"""The engine-step counters (core/step_stats.py) that put the bare engine and the core side by side under
tools/bench.py --profile: what one interval adds up to, the log line's round trip, and combining intervals."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from core.step_stats import EngineSteps, StepSnapshot, combine, parse_line


def _scheduler(running: int, waiting: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting)


def _iteration(generated: int, prompt: int = 0) -> SimpleNamespace:
    return SimpleNamespace(num_generation_tokens=generated, num_prompt_tokens=prompt)


def test_a_snapshot_counts_steps_batch_and_tokens_and_the_time_steps_took():
    steps = EngineSteps()
    steps.record(_scheduler(4, waiting=2), _iteration(0, prompt=400))  # a prefill step
    time.sleep(0.02)
    steps.record(_scheduler(4), _iteration(4))
    time.sleep(0.02)
    steps.record(_scheduler(0), _iteration(2))  # the last two finished: nothing runs after it
    time.sleep(0.05)  # idle: not the engine's steps' time
    steps.record(None, _iteration(1))  # an output without scheduler statistics is no step
    snap = steps.snapshot()
    assert (snap.steps, snap.running_max, snap.generation_tokens, snap.prompt_tokens) == (3, 4, 7, 400)
    assert snap.running_mean == pytest.approx(8 / 3)
    assert snap.waiting_mean == pytest.approx(2 / 3)
    assert 0.04 <= snap.busy_seconds < 0.09  # the two gaps after steps with requests running, not the idle time
    assert snap.seconds >= 0.09
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


def test_the_log_line_reads_back_inside_a_triton_log_line():
    snap = StepSnapshot(
        seconds=0.5, busy_seconds=0.412, steps=61, running_mean=255.2, running_max=256, waiting_mean=0.4,
        generation_tokens=15500, prompt_tokens=3200,
    )  # fmt: skip
    line = f"I1123 20:38:27.123 1234 pb_stub.cc:1] vllm_core {snap.describe()}"
    assert parse_line(line) == StepSnapshot(0.5, 0.412, 61, 255.2, 256, 0.4, 15500, 3200)
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
