"""Preprocess time per request: chat template + tokenization (+ sampling validation), on a ~1k-token conversation.

    python tools/bench_preprocess.py [--tokenizer models/tiny-llama] [--requests 500] [--turns 12]

Runs the real stage (preprocess.default.Preprocessor.build_request) in this process, one request at a time, and
prints p50/p99/mean in milliseconds, for the chat path and for the plain text_input path of the same prompt.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

# Only the installed `preprocess` package is imported (`make setup` installs the project editable): no sys.path
# preamble needed, unlike the tools that import tools.*.
ROOT = Path(__file__).resolve().parent.parent

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Grüße aus München: das Wetter ist heute schön und warm.",
    "Once upon a time, a small robot learned to read the stars.",
    "def handle(request): return {'status': 'ok', 'items': [1, 2, 3]}",
]


def conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant. Answer briefly and precisely."}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(3))})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": SENTENCES[0]})
    return messages


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=str(ROOT / "models" / "tiny-llama"))
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--turns", type=int, default=12)
    args = parser.parse_args(argv)

    import numpy as np

    from preprocess.default import Preprocessor

    stage = Preprocessor({"tokenizer": args.tokenizer, "max_model_len": 8192})
    messages = json.dumps(conversation(args.turns))
    sampling = json.dumps({"temperature": 0.7, "top_p": 0.9, "max_tokens": 128, "stop": ["\n\n"]})

    def tensor(text: str) -> np.ndarray:
        return np.array([text.encode("utf-8")], dtype=np.object_)

    chat_inputs = {"messages": tensor(messages), "sampling_parameters": tensor(sampling)}
    first = stage.build_request(chat_inputs, {})
    prompt = first.postprocess_options["prompt_prefix"]
    text_inputs = {"text_input": tensor(prompt), "sampling_parameters": tensor(sampling)}
    print(f"conversation: {args.turns + 1} messages, {len(first.prompt_token_ids)} prompt tokens")

    for name, inputs in (("messages (template + tokenize)", chat_inputs), ("text_input (tokenize)", text_inputs)):
        for _ in range(20):  # warm-up: template compilation cache, tokenizer caches
            stage.build_request(inputs, {})
        times = []
        for _ in range(args.requests):
            start = time.perf_counter()
            stage.build_request(inputs, {})
            times.append((time.perf_counter() - start) * 1000)
        print(
            f"{name:32s} p50 {percentile(times, 0.5):6.3f} ms  p99 {percentile(times, 0.99):6.3f} ms"
            f"  mean {statistics.fmean(times):6.3f} ms  ({args.requests} requests, one at a time)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
