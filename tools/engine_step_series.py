"""The bare engine's steps one by one: a level of tools/bench.py's bare path with a stat logger that keeps every
engine step, printed per second of the level.

    .venv/bin/python tools/engine_step_series.py [--deployment FILE] [--concurrency 256] [--requests 12288]
        [--max-tokens 64] [--out .bench/step-series]

tools/bench.py reports a level's means; this shows how they move inside it. Per second: the engine's steps, those
that computed prompt tokens, the prompt tokens computed, the tokens generated, the requests in the batch, the
prefix cache's hit share, the EngineCore's wait for the model's result per decode-only and per mixed step (the rest
of a step is its own CPU work), and the requests that finished with their mean latency. On the H100 this told a
slow spell of the machine (fewer steps a second with the same batch, prompts and GPU wait) from the engine doing
more work (docs/performance-gpu.md). The engine is configured and placed as tools/bench.py's bare path (the
deployment's engine args and environment, `core.engine_cpus`), with vLLM's statistics on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class Step:
    at: float  # perf_counter when the front end got the step's statistics
    running: int
    prompt_tokens: int  # computed in the step (vLLM's iteration details)
    generated: int
    wait_ms: float | None  # the EngineCore's wait for the model's result
    cache_queries: int
    cache_hits: int


class StepRecorder:
    """A stat-logger sink (core/metrics.py stat_logger_factory) that keeps every step."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._lock = threading.Lock()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is None:
            return
        details = getattr(scheduler_stats, "iteration_details", None)
        cache = getattr(scheduler_stats, "prefix_cache_stats", None)
        step = Step(
            at=time.perf_counter(),
            running=scheduler_stats.num_running_reqs,
            prompt_tokens=details.num_ctx_tokens if details is not None else 0,
            generated=iteration_stats.num_generation_tokens if iteration_stats is not None else 0,
            wait_ms=details.elapsed_ms if details is not None else None,
            cache_queries=cache.queries if cache is not None else 0,
            cache_hits=cache.hits if cache is not None else 0,
        )
        with self._lock:
            self.steps.append(step)

    def take(self) -> list[Step]:
        with self._lock:
            steps, self.steps = self.steps, []
        return steps


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def per_second(steps: list[Step], finished: list[tuple[float, float]], start: float) -> list[dict[str, Any]]:
    """The level's steps and finished requests (when, latency) by second since `start`."""
    seconds: dict[int, list[Step]] = {}
    for step in steps:
        seconds.setdefault(int(step.at - start), []).append(step)
    done: dict[int, list[float]] = {}
    for at, latency in finished:
        done.setdefault(int(at - start), []).append(latency)
    rows = []
    for second in sorted(seconds.keys() | done.keys()):
        group = seconds.get(second, [])
        mixed = [s for s in group if s.prompt_tokens > 0]
        queries = sum(s.cache_queries for s in group)
        latencies = done.get(second, [])
        rows.append(
            {
                "second": second,
                "steps": len(group),
                "mixed_steps": len(mixed),
                "prompt_tokens": sum(s.prompt_tokens for s in group),
                "generated": sum(s.generated for s in group),
                "batch": _mean([s.running for s in group]),
                "cache_hit_share": sum(s.cache_hits for s in group) / queries if queries else None,
                "wait_ms_decode": _mean([s.wait_ms for s in group if s.prompt_tokens == 0 and s.wait_ms is not None]),
                "wait_ms_mixed": _mean([s.wait_ms for s in mixed if s.wait_ms is not None]),
                "finished": len(latencies),
                "latency_ms": 1000 * _mean(latencies) if latencies else None,
            }
        )
    return rows


COLUMNS = (
    ("second", "sec", "3d"),
    ("steps", "steps", "5d"),
    ("mixed_steps", "mixed", "5d"),
    ("prompt_tokens", "prompt_tok", "10d"),
    ("generated", "gen_tok", "7d"),
    ("batch", "batch", "5.1f"),
    ("cache_hit_share", "hit", "4.2f"),
    ("wait_ms_decode", "wait_dec", "8.2f"),
    ("wait_ms_mixed", "wait_mix", "8.2f"),
    ("finished", "done", "4d"),
    ("latency_ms", "latency_ms", "10.0f"),
)


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any, spec: str) -> str:
        width = int(spec.split(".")[0].rstrip("df") or 0)
        return "-".rjust(width) if value is None else format(value, spec)

    lines = [" ".join(title for _, title, _ in COLUMNS)]
    lines += [" ".join(cell(row[key], spec) for key, _, spec in COLUMNS) for row in rows]
    return "\n".join(lines)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from core.cpu_placement import EnginePlacement, pin_process
    from core.metrics import profiled_engine_args, stat_logger_factory
    from tools.bench import ENGINE_ENV_DEFAULTS, bench_repository, build_prompts, start_bare_engine
    from tools.bench_clients import engine_sender, run_level, warm_up_requests

    setup = bench_repository(args.out, args.deployment, {})
    os.environ.update({**ENGINE_ENV_DEFAULTS, **setup.engine_env})  # as tools/bench.py gives every engine
    if setup.engine_cpus:  # this process off the engine's CPUs first, as tools/bench.py's own process
        pin_process(os.getpid(), EnginePlacement(setup.engine_cpus).other_cpus)
    recorder = StepRecorder()
    engine_args = profiled_engine_args(setup.engine_args)
    llm = start_bare_engine(engine_args, setup.engine_cpus, [stat_logger_factory(recorder)])
    try:
        prompts = build_prompts(setup.tokenizer)
        send = engine_sender(llm, False, "series")
        await run_level(send, prompts, args.concurrency, warm_up_requests(args.concurrency), args.max_tokens)
        finished: list[tuple[float, float]] = []

        async def timed(prompt: Any, max_tokens: int) -> Any:
            sample = await send(prompt, max_tokens)
            finished.append((time.perf_counter(), sample.latency))
            return sample

        recorder.take()  # the warm-up's steps
        start = time.perf_counter()
        _, wall = await run_level(timed, prompts, args.concurrency, args.requests, args.max_tokens)
        rows = per_second(recorder.take(), finished, start)
    finally:
        llm.shutdown()
    return {
        "deployment": str(args.deployment or "deployments/default.yaml + BENCH_ENGINE_OVERRIDES"),
        "concurrency": args.concurrency,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "wall": wall,
        "tokens_per_second": args.requests * args.max_tokens / wall,
        "seconds": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=12288)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "step-series")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from tools.triton_server import private_tmp_dir

    with private_tmp_dir("vllm-series-"):  # vLLM leaves its socket files in TMPDIR
        result = asyncio.run(measure(args))
    (args.out / "step-series.json").write_text(json.dumps(result, indent=1))
    print(f"{result['tokens_per_second']:.0f} tok/s over {result['wall']:.1f} s")
    print(table(result["seconds"]))
    return 0


if __name__ == "__main__":  # the EngineCore is spawned: it imports this file again
    sys.exit(main())
