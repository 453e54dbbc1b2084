"""A pair of paths' paired ratio over every round of several benchmark runs, pooled per level.

    .venv/bin/python tools/pool_rounds.py FILE... [--pair bare,plain-grpc] [--below 0.95] [--min-streams 64]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz. A round is one repetition of a level in
one interleaved command (the two paths measured seconds apart); each round where both paths ran gives one ratio
(the second path's tok/s over the first's). Per level: the rounds, their median, range, and how many fall below
--below. What one command's three repetitions cannot say, many rounds of the same serving code can: whether a cell
trails in most rounds or only in some. Streams started out of step (--stagger-seconds) are another workload than waves:
their rounds pool apart from the waves' of the same level.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench import runs_of  # noqa: E402
from tools.pair_spread import read, rounds_of  # noqa: E402

Level = tuple[int, int, float]  # max_tokens, concurrency, stagger_seconds (0: waves)


def stagger_of(doc: dict) -> float:
    """The file's --stagger-seconds (one per file: the bench's --merge refuses to mix them)."""
    return max((run.stagger_seconds for run in runs_of(doc)), default=0.0)


def pooled_ratios(docs: list[dict], first: str, second: str, min_streams: int) -> dict[Level, list[float]]:
    """(max_tokens, concurrency, stagger) -> each round's tok/s of `second` over `first`, in the files' order."""
    pooled: dict[Level, list[float]] = defaultdict(list)
    for doc in docs:
        stagger = stagger_of(doc)
        for (max_tokens, concurrency, _), paths in sorted(rounds_of(doc).items()):
            if concurrency >= min_streams and first in paths and second in paths:
                pooled[(max_tokens, concurrency, stagger)].append(paths[second][1] / paths[first][1])
    return pooled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--pair", default="bare,plain-grpc", help="FIRST,SECOND: the ratio is SECOND / FIRST")
    parser.add_argument("--below", type=float, default=0.95, help="count the rounds whose ratio is below this")
    parser.add_argument("--min-streams", type=int, default=1, help="levels of at least this many streams")
    args = parser.parse_args(argv)
    first, _, second = args.pair.partition(",")
    if not first or not second:
        parser.error("--pair takes two paths: FIRST,SECOND")
    pooled = pooled_ratios([read(f) for f in args.files], first, second, args.min_streams)
    if not pooled:
        print(f"no round measured both {first} and {second}", file=sys.stderr)
        return 1
    print(f"{second} / {first} per round, pooled over {len(args.files)} file(s)")
    for (max_tokens, concurrency, stagger), ratios in sorted(pooled.items()):
        out_of_step = f" out of step by {stagger:g} s" if stagger else ""
        print(
            f"  {max_tokens} tokens x {concurrency} streams{out_of_step}: {len(ratios)} rounds, median"
            f" {statistics.median(ratios):.3f}, {min(ratios):.2f}-{max(ratios):.2f},"
            f" {sum(r < args.below for r in ratios)} below {args.below}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
