"""CPU per request of one engine front end (core/engine.py in this process, vLLM's EngineCore in its own), as a plain
stub of `entry: plain-core` is one: waves of requests submitted at once, each answered with one FINAL_ONLY output.

    python tools/measure_front_end_cpu.py [--requests 256] [--max-tokens 8] [--rounds 7]

Run from two checkouts (the same file copied into the older one), it compares what their front ends cost per
request: this process's CPU (every thread: the engine loop, vLLM's input processing and output handling; no
Triton, no stages) over a round's requests, and the EngineCore's for context (read from /proc in 10 ms clock ticks:
give a round enough requests). Prompts alternate between ~400 and a
few tokens, as the GPU benchmark's do. The median of the rounds is printed last; the first round warms up and is not
counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.triton_server import children_cpu_seconds, private_tmp_dir  # noqa: E402

LONG_PROMPT = 400  # tokens, as the benchmark's long prompts
SHORT_PROMPT = 12


def _wave(engine, requests) -> tuple[float, float, float]:
    """Submit every request at once and wait for all: (this process's CPU s, the EngineCore's, wall s)."""
    done = threading.Semaphore(0)

    def emit(response, error, final) -> None:
        if error is not None:
            raise error
        if final:
            done.release()

    cpu0, child0, wall0 = time.process_time(), children_cpu_seconds(), time.monotonic()
    for request in requests:
        engine.submit(request, emit, None)
    for _ in requests:
        done.acquire()
    return time.process_time() - cpu0, children_cpu_seconds() - child0, time.monotonic() - wall0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-json", type=Path, default=ROOT / "model_repository" / "vllm_core" / "1" / "model.json")
    parser.add_argument("--requests", type=int, default=256, help="requests per wave (round)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7, help="counted rounds, after one to warm up")
    args = parser.parse_args(argv)
    # The EngineCore in its own process, as behind every front end of plain-core: this process is the front end
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    from core.engine import Engine
    from core.engine_config import load_engine_args
    from core.protocol import EngineRequest

    engine_args = load_engine_args(args.model_json)
    engine_args["max_num_seqs"] = max(args.requests, 1)
    engine_args["max_model_len"] = max(int(engine_args.get("max_model_len") or 0), LONG_PROMPT + args.max_tokens + 8)
    sampling = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True}
    requests = [
        EngineRequest(
            sampling=sampling,
            prompt_token_ids=[(7 * i + j) % 100 + 3 for j in range(LONG_PROMPT if i % 2 else SHORT_PROMPT)],
            stream=False,
        )
        for i in range(args.requests)
    ]
    with private_tmp_dir("vllm-fe-cpu-"):  # vLLM leaves its socket files in TMPDIR
        return _measure(Engine(engine_args), requests, args.rounds)


def _measure(engine: Any, requests: list[Any], rounds: int) -> int:
    """A warm-up wave, then `rounds` counted waves of `requests` on `engine` (started here, shut down after)."""
    engine.start()
    try:
        _wave(engine, requests)  # warm-up
        per_request = []
        for r in range(rounds):
            cpu, child, wall = _wave(engine, requests)
            per_request.append(1000 * cpu / len(requests))
            print(
                f"round {r}: front end {per_request[-1]:.3f} ms CPU a request, EngineCore"
                f" {1000 * child / len(requests):.3f} ms, wall {wall:.2f} s for {len(requests)} requests"
            )
        print(
            f"front end CPU a request: median {statistics.median(per_request):.3f} ms over {rounds} rounds"
            f" ({min(per_request):.3f}-{max(per_request):.3f}); tree {ROOT}"
        )
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
