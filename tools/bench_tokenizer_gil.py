"""What tokenizing threads cost a busy Python thread of the same process (core.preprocess_threads' price under load).

    PYTHONPATH=. python tools/bench_tokenizer_gil.py [--tokenizer models/tiny-llama] [--rates 100,300] [--seconds 3]
        [--reps 3]

One thread stands for a front end's busy interpreter (the engine's output handling: small Python work items back to
back, counted); 3 threads tokenize a ~500-token text at a fixed rate, either through transformers (its Rust code
releases the GIL and takes it back) or the Rust tokenizer called directly (holds the GIL throughout). Prints the busy
thread's items per second over the same with no tokenizing measured just before (median and each repetition), and
each tokenization's latency. The GIL switch interval is the benchmark deployment's core.switch_interval_ms (0.5 ms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tools" / "corpus"


def run(tokenize: Callable[[], object] | None, rate: float, seconds: float) -> tuple[float, list[float]]:
    """(the busy thread's work items per second, each tokenization's seconds from submit to its end)."""
    stop = time.monotonic() + seconds
    items = 0
    latencies: list[float] = []

    def busy() -> None:
        nonlocal items
        while time.monotonic() < stop:
            total = 0
            for i in range(200):
                total += i
            items += 1

    def one(submitted: float) -> None:
        tokenize()
        latencies.append(time.monotonic() - submitted)

    thread = threading.Thread(target=busy)
    thread.start()
    with ThreadPoolExecutor(3) as pool:
        due = time.monotonic()
        while tokenize is not None and time.monotonic() < stop:
            pool.submit(one, time.monotonic())
            due += 1 / rate
            time.sleep(max(0.0, due - time.monotonic()))
        thread.join()
    return items / seconds, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=str(ROOT / "models" / "tiny-llama"))
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[100.0, 300.0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    sys.setswitchinterval(0.0005)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    text = sorted(CORPUS.iterdir())[0].read_text()[:2000]
    ways: dict[str, Callable[[], object]] = {
        "transformers (releases the GIL)": lambda: tokenizer.encode(text),
        "Rust tokenizer directly (holds it)": lambda: tokenizer.backend_tokenizer.encode(text).ids,
    }
    print(f"{len(tokenizer.encode(text))}-token text, 3 tokenizing threads, switch interval 0.5 ms, {args.reps} reps")
    for rate in args.rates:
        ratios: dict[str, list[float]] = {name: [] for name in ways}
        latencies: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.reps):  # each repetition's own baseline, measured just before
            alone, _ = run(None, rate, args.seconds)
            for name, tokenize in ways.items():
                items, seen = run(tokenize, rate, args.seconds)
                ratios[name].append(items / alone)
                latencies[name] += seen
        for name in ways:
            spread = " ".join(f"{r:.2f}" for r in ratios[name])
            p50 = statistics.median(latencies[name]) * 1e3
            p99 = statistics.quantiles(latencies[name], n=100)[98] * 1e3
            print(
                f"{rate:5.0f}/s  {name:36s} busy thread {statistics.median(ratios[name]):.2f}x of alone ({spread})"
                f"  tokenizing p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )


if __name__ == "__main__":
    main()
