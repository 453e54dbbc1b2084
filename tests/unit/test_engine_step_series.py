"""tools/engine_step_series.py's arithmetic: steps and finished requests grouped by second of the level."""

from __future__ import annotations

from types import SimpleNamespace

from tools.engine_step_series import Step, StepRecorder, per_second, table


def _step(at: float, running: int, prompt: int, generated: int, wait: float | None = 0.1) -> Step:
    return Step(at, running, prompt, generated, wait, cache_queries=10, cache_hits=9 if prompt else 0)


def test_steps_and_requests_grouped_by_second():
    start = 100.0
    steps = [_step(100.2, 4, 0, 4), _step(100.6, 4, 30, 4, 0.3), _step(101.1, 2, 0, 2, None)]
    finished = [(100.9, 0.5), (101.5, 0.7), (101.8, 0.9), (102.2, 1.0)]
    rows = per_second(steps, finished, start)
    assert [row["second"] for row in rows] == [0, 1, 2]  # a second with requests finishing and no step counts too
    first, second, third = rows
    assert (first["steps"], first["mixed_steps"], first["prompt_tokens"], first["generated"]) == (2, 1, 30, 8)
    assert first["batch"] == 4 and first["cache_hit_share"] == 9 / 20
    assert first["wait_ms_decode"] == 0.1 and first["wait_ms_mixed"] == 0.3
    assert (first["finished"], first["latency_ms"]) == (1, 500.0)
    assert second["wait_ms_decode"] is None and second["wait_ms_mixed"] is None  # no details in that step
    assert second["finished"] == 2 and round(second["latency_ms"]) == 800
    assert third["steps"] == 0 and third["batch"] is None and third["finished"] == 1
    text = table(rows).splitlines()
    assert text[0].split()[:3] == ["sec", "steps", "mixed"] and len(text) == 4
    assert text[3].split()[1] == "0" and "-" in text[3].split()  # empty cells print as "-"


def test_recorder_keeps_every_step_with_its_details_and_hands_them_over_once():
    recorder = StepRecorder()
    details = SimpleNamespace(num_ctx_tokens=16, elapsed_ms=0.25)
    cache = SimpleNamespace(queries=32, hits=16)
    scheduler = SimpleNamespace(num_running_reqs=3, iteration_details=details, prefix_cache_stats=cache)
    recorder.record(scheduler, SimpleNamespace(num_generation_tokens=3))
    recorder.record(SimpleNamespace(num_running_reqs=2), None)  # without details: vLLM's statistics only
    recorder.record(None, SimpleNamespace(num_generation_tokens=1))  # no scheduler statistics: not a step
    first, second = recorder.take()
    assert (first.running, first.prompt_tokens, first.generated, first.wait_ms) == (3, 16, 3, 0.25)
    assert (first.cache_queries, first.cache_hits) == (32, 16)
    assert (second.prompt_tokens, second.generated, second.wait_ms, second.cache_queries) == (0, 0, None, 0)
    assert recorder.take() == []
