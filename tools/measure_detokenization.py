"""Measure where detokenization costs CPU: the engine process with and without vLLM's own detokenizer, and the
postprocess stage per streamed response. Same workload both ways, in one run, alternating rounds.

    python tools/measure_detokenization.py [--requests 32] [--max-tokens 128] [--rounds 2] [--logprobs 0]
    python tools/measure_detokenization.py --micro      # per-token costs, single thread, no engine
    python tools/measure_detokenization.py --wire       # the stages' wire format per hop, no engine

The engine runs as in the vllm_core model (core/engine.py, the repository's model.json), without Triton: each
engine response is encoded as the core adapter does. "engine process" is this process (AsyncLLM's
output processing, where vLLM detokenizes, plus the core's own work); the EngineCore child (the model) is
reported apart. Postprocess CPU is the thread CPU time of `VllmBackendPostprocessor.process` per streamed
response, replayed on the offloaded round's responses (all return_* outputs on).

`--wire` times what every response pays between the stages, per hop, on RequestOutputs shaped like vLLM's (text
already decoded, so no detokenization is in the numbers): the core (RequestOutput -> engine_response bytes), the
plain path's generate step (the core's one whole answer -> what it hands to postprocess), postprocess (bytes ->
the vLLM backend's tensors, all return_* outputs on), and the engine_request hop (preprocess encodes, the core
decodes; a 400-token prompt). Thread CPU time, median of --runs runs.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The tests' reference prompts (multi-byte text the tiny tokenizer was trained on): the same workload as the suite.
from tests.support.triton_helpers import REFERENCE_PROMPTS as PROMPTS  # noqa: E402
from tools.triton_server import children_cpu_seconds  # noqa: E402

RETURN_ALL = [
    "return_finish_reason",
    "return_cumulative_logprob",
    "return_logprobs",
    "return_num_input_tokens",
    "return_num_output_tokens",
]


def _round(engine, requests, offload: bool, sync_ids) -> tuple[float, float, float, list[bytes], int]:
    from core.protocol import decode_request, encode_request, encode_response

    engine._sync_ids = sync_ids if offload else None  # the engine's switch (None: vLLM detokenizes)
    done = threading.Semaphore(0)
    responses: list[bytes] = []
    tokens = [0]
    lock = threading.Lock()

    def emit_for():
        def emit(response, error, final):
            if error is not None:
                raise error
            raw = encode_response(response)  # what the core adapter sends to postprocess
            with lock:
                responses.append(raw)
                tokens[0] += sum(len(s.token_ids) for s in response.outputs)
            if final:
                done.release()

        return emit

    cpu0, child0, wall0 = time.process_time(), children_cpu_seconds(), time.monotonic()
    for request in requests:
        engine.submit(decode_request(encode_request(request)), emit_for(), lambda: False)
    for _ in requests:
        done.acquire()
    wall = time.monotonic() - wall0
    return time.process_time() - cpu0, children_cpu_seconds() - child0, wall, responses, tokens[0]


def micro(tokenizer_path: str, repeat: int = 20) -> None:
    """Per-token CPU of what moves: vLLM's incremental text decoding vs the core's windows and larger JSON."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    from core.protocol import EngineResponse, SequenceDelta, encode_response
    from core.token_sync import sync_token_ids
    from core.token_windows import TokenWindows

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    output = tokenizer.encode("Grüße aus München, 你好世界! The quick brown fox jumps. " * 40)[:512]
    prompt = tokenizer.encode(PROMPTS[4])
    sync_ids = sync_token_ids(tokenizer)
    params = SimpleNamespace(
        stop=None, min_tokens=0, include_stop_str_in_output=False, skip_special_tokens=True,
        spaces_between_special_tokens=True,
    )  # fmt: skip

    def vllm_decode() -> None:
        request = SimpleNamespace(request_id="m", prompt_token_ids=prompt, sampling_params=params)
        detokenizer = FastIncrementalDetokenizer(tokenizer, request)
        for token_id in output:
            detokenizer.update([token_id], False)
            detokenizer.get_next_output_text(False, True)

    def windows() -> None:
        w = TokenWindows(prompt, sync_ids, logprobs=False)
        for token_id in output:
            w.next_window(0, [token_id])

    def responses(offload: bool) -> None:
        for token_id in output:
            delta = SequenceDelta(0, "", [token_id], context_ids=[token_id] if offload else None)
            encode_response(
                EngineResponse(
                    [delta], len(prompt), False, {"prompt_prefix": "", "return": []}, decode={} if offload else None
                )
            )

    for name, run in [
        ("vLLM incremental text decoding (what leaves the engine)", vllm_decode),
        ("core: token windows (what the engine does instead)", windows),
        ("core: engine response encoded, vLLM decodes", lambda: responses(False)),
        ("core: engine response encoded, postprocess decodes", lambda: responses(True)),
    ]:
        run()
        start = time.thread_time()
        for _ in range(repeat):
            run()
        print(f"{name}: {1e6 * (time.thread_time() - start) / repeat / len(output):.2f} us per token")


def _timed(fn: Callable[[], object], runs: int) -> float:
    """Median over `runs` of the thread CPU microseconds per call (each run loops for ~20 ms)."""
    start = time.thread_time()
    fn()
    loops = max(1, int(0.02 / max(time.thread_time() - start, 1e-6)))
    samples = []
    for _ in range(runs):
        start = time.thread_time()
        for _ in range(loops):
            fn()
        samples.append(1e6 * (time.thread_time() - start) / loops)
    return statistics.median(samples)


def _request_output(tokens: int, logprobs: int, streamed: bool) -> Any:
    """A vLLM RequestOutput's shape (the attributes core/vllm_io.py reads): `tokens` new tokens of one sequence,
    with `logprobs` alternatives per token (the sampled one among them) when logprobs > 0."""
    from types import SimpleNamespace

    rng = random.Random(tokens * 31 + logprobs)
    token_ids = [rng.randrange(32000) for _ in range(tokens)]
    positions = None
    if logprobs:
        positions = []
        for token_id in token_ids:
            alternatives = [token_id] + [rng.randrange(32000) for _ in range(logprobs - 1)]
            positions.append(
                {
                    tid: SimpleNamespace(logprob=-rng.random() * (rank + 1), rank=rank + 1, decoded_token=f" w{tid}")
                    for rank, tid in enumerate(alternatives)
                }
            )
    seq = SimpleNamespace(
        index=0,
        text="".join(f" w{t}" for t in token_ids),
        token_ids=token_ids,
        finish_reason=None if streamed else "length",
        stop_reason=None,
        cumulative_logprob=-1.5 * tokens if logprobs else None,
        logprobs=positions,
    )
    return SimpleNamespace(
        request_id="triton-1", prompt_token_ids=list(range(400)), outputs=[seq], finished=not streamed,
        prompt_logprobs=None,
    )  # fmt: skip


def wire(runs: int) -> None:
    """Per-hop CPU of the stages' wire format (see the module docstring)."""
    import numpy as np

    from core.interface import RETURN_FLAGS
    from core.protocol import EngineRequest, decode_request, encode_request, encode_response, whole_answer
    from core.vllm_io import to_engine_response
    from postprocess.vllm_backend import VllmBackendPostprocessor

    stage = VllmBackendPostprocessor({})
    options = {"prompt_prefix": "", "return": [flag.name for flag in RETURN_FLAGS]}

    def core(output: Any, streamed: bool) -> bytes:
        return encode_response(to_engine_response(output, options, streamed=streamed))

    def generate(raw: bytes) -> bytes:
        return whole_answer([raw])

    def postprocess(raw: bytes) -> dict[str, Any]:
        return stage.process({"engine_response": np.array([raw], dtype=np.object_)}, {})

    print(f"{'us per response (median of ' + str(runs) + ')':34s} {'core':>8s} {'generate':>9s} {'postproc':>9s}"
          f" {'total':>8s} {'bytes':>7s}")  # fmt: skip
    cases = [("streamed delta", 1, True), ("plain answer", 64, False), ("plain answer", 256, False)]
    for name, tokens, streamed in cases:
        for logprobs in (0, 5):
            output = _request_output(tokens, logprobs, streamed)
            raw = core(output, streamed)
            times = [_timed(lambda: core(output, streamed), runs)]  # noqa: B023 - called at once
            times.append(0.0 if streamed else _timed(lambda: generate(raw), runs))  # noqa: B023
            handed = raw if streamed else generate(raw)
            times.append(_timed(lambda: postprocess(handed), runs))  # noqa: B023
            label = f"{name}, {tokens} token{'s' if tokens > 1 else ''}, logprobs {logprobs}"
            cells = " ".join(f"{t:8.1f}" if t else f"{'-':>8s}" for t in times)
            print(f"{label:34s} {cells} {sum(times):9.1f} {len(raw):7d}")
    request = EngineRequest(
        sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 128, "stop": ["\n\n"]},
        prompt_token_ids=list(range(1000, 1400)),
        postprocess_options=options,
    )
    raw = encode_request(request)
    hop = _timed(lambda: decode_request(encode_request(request)), runs)
    print(f"{'engine_request, 400-token prompt':34s} {'preprocess encode + core decode':>27s} {hop:9.1f} {len(raw):7d}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-json", type=Path, default=ROOT / "model_repository" / "vllm_core" / "1" / "model.json")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--logprobs", type=int, default=0, help="sampling logprobs (0: not asked)")
    parser.add_argument("--micro", action="store_true", help="per-token microbenchmarks only")
    parser.add_argument("--wire", action="store_true", help="the wire format's CPU per hop only (no engine)")
    parser.add_argument("--runs", type=int, default=7, help="--wire: runs per measurement (the median is printed)")
    args = parser.parse_args(argv)
    if args.wire:
        wire(args.runs)
        return 0
    if args.micro:
        from core.engine_config import load_engine_args

        engine_args = load_engine_args(args.model_json)
        micro(engine_args.get("tokenizer", engine_args["model"]))
        return 0

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer

    from core.engine import Engine
    from core.engine_config import load_engine_args
    from core.protocol import EngineRequest
    from postprocess.vllm_backend import VllmBackendPostprocessor

    engine_args = load_engine_args(args.model_json)
    tokenizer_path = engine_args.get("tokenizer", engine_args["model"])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    sampling = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True}
    if args.logprobs:
        sampling["logprobs"] = args.logprobs
    requests = [
        EngineRequest(
            sampling=sampling,
            prompt_token_ids=tokenizer.encode(PROMPTS[i % len(PROMPTS)]),
            stream=True,
            postprocess_options={"prompt_prefix": "", "return": RETURN_ALL},
        )
        for i in range(args.requests)
    ]

    engine = Engine(engine_args)
    engine.start()
    try:
        sync_ids = engine._sync_ids
        assert sync_ids is not None, "this tokenizer has no sync table: the engine always detokenizes"
        _round(engine, requests[:4], True, sync_ids)  # warm-up (and the logprobs op compile)
        _round(engine, requests[:4], False, sync_ids)
        totals = {True: [0.0, 0.0, 0.0, 0], False: [0.0, 0.0, 0.0, 0]}
        offloaded: list[bytes] = []
        texts: dict[bool, list[bytes]] = {}
        for r in range(args.rounds):
            for offload in (True, False) if r % 2 == 0 else (False, True):
                cpu, child, wall, responses, tokens = _round(engine, requests, offload, sync_ids)
                t = totals[offload]
                t[0], t[1], t[2], t[3] = t[0] + cpu, t[1] + child, t[2] + wall, t[3] + tokens
                label = "postprocess decodes" if offload else "vLLM decodes     "
                print(
                    f"round {r} {label}: engine process {cpu:6.2f} s CPU, EngineCore {child:6.2f} s,"
                    f" wall {wall:5.2f} s, {tokens} tokens, {len(responses)} responses"
                )
                if offload:
                    offloaded = responses
                texts[offload] = responses
    finally:
        engine.shutdown()

    on, off = totals[True], totals[False]
    print(
        f"\nengine process CPU per 1000 tokens: vLLM decodes {1000 * off[0] / off[3]:.3f} s,"
        f" postprocess decodes {1000 * on[0] / on[3]:.3f} s -> saved {100 * (1 - on[0] / off[0]):.1f}%"
        f" of the engine process's CPU"
    )
    print(
        f"EngineCore (model) CPU per 1000 tokens: {1000 * off[1] / off[3]:.3f} s vs {1000 * on[1] / on[3]:.3f} s;"
        f" engine process + EngineCore saved {100 * (1 - (on[0] + on[1]) / (off[0] + off[1])):.1f}%"
    )

    stage = VllmBackendPostprocessor({"tokenizer": tokenizer_path})
    import numpy as np

    samples = []
    for raw in offloaded:
        tensor = np.array([raw], dtype=np.object_)
        start = time.thread_time_ns()
        stage.process({"engine_response": tensor}, {})
        samples.append((time.thread_time_ns() - start) / 1000)
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    print(
        f"postprocess CPU per streamed response ({len(samples)} responses): p50 {p50:.0f} us, p99 {p99:.0f} us,"
        f" mean {statistics.fmean(samples):.0f} us"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
