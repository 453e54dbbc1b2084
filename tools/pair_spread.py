"""How the spread of a paired ratio grows with how far apart its two paths are in --interleave's turn.

    .venv/bin/python tools/pair_spread.py FILE... [--min-streams 64]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz. For every two paths measured in the same
round (one command's repetition of a level), the log of their tok/s ratio; within a file, level and pair, each
round's deviation from that pair's mean over the rounds; pooled as the root mean square (with n / (n - 1)) by their
distance in the turn (1: measured one right after the other). A run records its place in the turn (turn_index);
for runs of an older bench it is rebuilt from the command as that bench ordered the turn (the engines' groups in
turn: bare, front ends, `vllm serve`, Triton). Repetitions under --background-load are left out.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench import build_parser, measured_paths  # noqa: E402
from tools.bench_paths import engine_groups  # noqa: E402
from tools.bench_results import runs_of  # noqa: E402

NAMED_PAIRS = (
    ("bare", "plain-grpc"),
    ("bare-stream", "stream-grpc"),
    ("bare", "bare-stream"),
    ("vllm-serve", "plain-grpc"),
    ("vllm-serve-stream", "stream-grpc"),
)


def older_turn(command: str) -> list[str] | None:
    """The turn of an interleaved command of a bench before turn_order, the engines' groups one after the other
    (None: the command was not interleaved)."""
    args, _ = build_parser().parse_known_args(shlex.split(command)[1:])  # options of today's bench only
    if not args.interleave:
        return None
    return [path for group in engine_groups(measured_paths(args)) for path in group]


def rounds_of(doc: dict[str, Any]) -> dict[tuple[int, int, str], dict[str, tuple[int, float]]]:
    """(max_tokens, concurrency, round) -> path -> (place in the turn, tok/s), interleaved rounds only."""
    commands = [c["command"] for c in doc.get("commands", [])]
    rounds: dict[tuple[int, int, str], dict[str, tuple[int, float]]] = defaultdict(dict)
    for run in runs_of(doc):
        if not run.round_id or run.background_load:
            continue
        place = run.turn_index
        if place is None:
            command = int(run.round_id.split(".")[0])
            turn = older_turn(commands[command]) if command < len(commands) else None
            if turn is None or run.path not in turn:
                continue
            place = turn.index(run.path)
        rounds[(run.max_tokens, run.concurrency, run.round_id)][run.path] = (place, run.tokens_per_second)
    return rounds


def squared_deviations(docs: list[dict[str, Any]], min_streams: int) -> dict[tuple[str, str, int], list[float]]:
    """(path, path, distance) -> each round's squared deviation of the pair's log ratio from its mean."""
    pooled: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for doc in docs:
        series: dict[tuple[int, int, str, str, int], list[float]] = defaultdict(list)
        for (max_tokens, concurrency, _), paths in rounds_of(doc).items():
            if concurrency < min_streams:
                continue
            for a, (place_a, rate_a) in paths.items():
                for b, (place_b, rate_b) in paths.items():
                    if a < b:  # each pair once, one direction (by name)
                        series[(max_tokens, concurrency, a, b, abs(place_b - place_a))].append(
                            math.log(rate_b / rate_a)
                        )
        for (_, _, a, b, distance), ratios in series.items():
            if len(ratios) < 2:
                continue
            mean = sum(ratios) / len(ratios)
            pooled[(a, b, distance)] += [(r - mean) ** 2 * len(ratios) / (len(ratios) - 1) for r in ratios]
    return pooled


def rms(values: list[float]) -> float:
    return math.sqrt(sum(values) / len(values))


def read(path: Path) -> dict[str, Any]:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return json.loads(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--min-streams", type=int, default=64, help="levels of at least this many streams")
    args = parser.parse_args(argv)
    pooled = squared_deviations([read(f) for f in args.files], args.min_streams)
    by_distance: dict[int, list[float]] = defaultdict(list)
    for (_, _, distance), values in pooled.items():
        by_distance[distance] += values
    print(f"rms of a paired log ratio's deviation, levels of {args.min_streams}+ streams, by distance in the turn")
    for distance, values in sorted(by_distance.items()):
        print(f"  every pair, distance {distance}: {rms(values):.3f} ({len(values)} rounds)")
    for a, b in NAMED_PAIRS:
        pair = (min(a, b), max(a, b))
        for distance in sorted(d for (x, y, d) in pooled if (x, y) == pair):
            values = pooled[(*pair, distance)]
            print(f"  {a} / {b}, distance {distance}: {rms(values):.3f} ({len(values)} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
