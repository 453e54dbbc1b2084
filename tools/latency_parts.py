"""A path's request latency beside a reference path's, part by part, in each profiled round.

    .venv/bin/python tools/latency_parts.py FILE... [--pair bare,plain-grpc]... [--min-streams 16]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz, measured with `--profile` (the rounds'
`engine_lags`, core/engine_lags.py, by the EngineCore's clock). A request's mean latency is, to within a few ms, its
intake (handed to vLLM until the EngineCore queued it), its queue and first token inside the EngineCore,
max_tokens - 1 times the EngineCore's time per token after the first, and the return (the step's end until its
consumer had the output). For each level and pair, each round where both paths were profiled gives the path's
figures less the reference's (ms) and its time per token over the reference's; then the medians over the rounds.
A difference in the latency that the intake and the return account for is the hops' (Triton, the front ends); one
in the time per token is the EngineCore's steps themselves (slower, or over more of them).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench_results import LevelResult, round_order, runs_of  # noqa: E402
from tools.pair_spread import read  # noqa: E402

DEFAULT_PAIRS = ("bare,plain-grpc", "bare-stream,stream-grpc")

# max_tokens, concurrency, stagger_seconds (0: waves), slices (1: measured whole)
LevelKey = tuple[int, int, float, int]


@dataclass(frozen=True)
class Parts:
    """One path's round: its requests' mean latency and its parts, ms."""

    latency: float
    intake: float
    first_token: float  # queued in the EngineCore until the step that made the first token ended
    tokens: float  # (max_tokens - 1) x the EngineCore's time per token
    token_ms: float
    returned: float

    @property
    def columns(self) -> tuple[float, ...]:
        return (self.latency, self.intake, self.first_token, self.tokens, self.returned)


def parts_of(run: LevelResult) -> Parts | None:
    """None for a round without its latencies or the engine's per-request times (not profiled)."""
    lags = run.engine_lags or {}
    if not run.latencies or not lags.get("finished") or not lags.get("requests"):
        return None
    return Parts(
        latency=1000 * statistics.fmean(run.latencies),
        intake=lags["intake_ms"],
        first_token=lags["queue_ms"] + lags["prefill_ms"],
        tokens=(run.max_tokens - 1) * lags["token_ms"],
        token_ms=lags["token_ms"],
        returned=lags["return_ms"],
    )


@dataclass(frozen=True)
class Difference:
    """A round of `path` less the same round of the reference: ms for each of Parts.columns, and the time per
    token's ratio."""

    ms: tuple[float, ...]
    token_ratio: float


def differences(
    runs: list[list[LevelResult]], reference: str, path: str, min_streams: int
) -> dict[LevelKey, list[Difference]]:
    """Per level, each round (of each file: `runs` holds one list per file) where both paths were profiled."""
    found: dict[LevelKey, list[Difference]] = {}
    for file_runs in runs:
        rounds: dict[tuple[LevelKey, str], dict[str, Parts]] = {}
        for run in file_runs:
            if run.concurrency < min_streams or run.path not in (reference, path) or run.background_load:
                continue
            parts = parts_of(run)
            if parts is not None and run.round_id:
                level = (run.max_tokens, run.concurrency, run.stagger_seconds, run.slices)
                rounds.setdefault((level, run.round_id), {})[run.path] = parts
        for (level, _), by_path in sorted(rounds.items(), key=lambda item: round_order(item[0][1])):
            if reference in by_path and path in by_path:
                ours, theirs = by_path[path], by_path[reference]
                found.setdefault(level, []).append(
                    Difference(
                        ms=tuple(a - b for a, b in zip(ours.columns, theirs.columns, strict=True)),
                        token_ratio=ours.token_ms / theirs.token_ms,
                    )
                )
    return found


def _signed(values: list[float]) -> str:
    return " ".join(f"{v:+.0f}" if abs(v) >= 10 else f"{v:+.1f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--pair",
        action="append",
        help="REFERENCE,PATH (repeatable; default: bare,plain-grpc and bare-stream,stream-grpc)",
    )
    parser.add_argument("--min-streams", type=int, default=16, help="levels of at least this many streams")
    args = parser.parse_args(argv)
    runs = [runs_of(read(file)) for file in args.files]
    printed = False
    for pair in args.pair or DEFAULT_PAIRS:
        reference, _, path = pair.partition(",")
        found = differences(runs, reference, path, args.min_streams)
        if not found:
            continue
        if not printed:
            print(
                "ms per round, the path's less the reference's in the same round (median):"
                " latency = intake + first token + (max_tokens - 1) x time per token + return, by the EngineCore's"
                " clock; then the time per token's ratio"
            )
            printed = True
        print(f"{path} less {reference}")
        for (max_tokens, concurrency, stagger, slices), rounds in sorted(found.items()):
            out_of_step = f", out of step by {stagger:g} s" if stagger else ""
            sliced = f", in {slices} slices" if slices > 1 else ""
            print(f"  {max_tokens} tokens x {concurrency} streams{out_of_step}{sliced}, {len(rounds)} rounds")
            names = ("latency", "intake", "first token", "tokens", "return")
            for index, name in enumerate(names):
                values = [d.ms[index] for d in rounds]
                print(f"    {name:<12} {_signed(values)} ({statistics.median(values):+.1f})")
            ratios = [d.token_ratio for d in rounds]
            print(f"    {'per token':<12} {' '.join(f'{r:.2f}' for r in ratios)} ({statistics.median(ratios):.3f}x)")
    if not printed:
        print("no profiled round of both paths of a pair matched", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
