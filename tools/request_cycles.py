"""Where a stream's time per request goes, per path and round: inside the requests or between them.

    .venv/bin/python tools/request_cycles.py FILE... [--paths bare,plain-grpc] [--min-streams 64]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz. Each stream of a level sends its
requests one after the other, so a round's wall time x streams / requests is the time a stream spends per request
(its cycle), and the cycle less the requests' mean latency is the time between a response and the stream's next
request (the client's turn-around and the level's ragged start and end). A path that trails the bare engine with
the same time between requests loses inside them (the engine's steps, the server's hops); one with more time
between them loses in the client or the trip back. Levels measured in slices (--one-stream-slices, --wave-slices)
are shown apart: their wall time adds up the slices', and each slice starts its streams together, so their time
between requests holds every slice's ragged start and end (the same for every path of the level).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench_results import LevelResult, percentile, runs_of  # noqa: E402
from tools.pair_spread import read  # noqa: E402

# max_tokens, concurrency, stagger_seconds (0: waves), slices (1: measured whole)
LevelKey = tuple[int, int, float, int]


@dataclass(frozen=True)
class Cycle:
    """One path's round of one level, in seconds."""

    cycle: float  # a stream's time per request
    latency: float  # the requests' mean latency
    p10: float
    p90: float
    # of the cycle, out of the engine's batch (a --profile round, which has the engine's mean batch), else None
    outside: float | None = None

    @property
    def between(self) -> float:
        return self.cycle - self.latency


def cycle_of(run: LevelResult) -> Cycle | None:
    """None for a level without its latencies."""
    if not run.latencies or run.requests <= 0:
        return None
    cycle = run.wall * run.concurrency / run.requests
    batch = (run.engine_steps or {}).get("running_mean")
    # Little's law: the share of the streams not in the engine's batch, times the cycle
    outside = None if batch is None else max(0.0, run.concurrency - batch) / run.concurrency * cycle
    return Cycle(
        cycle=cycle,
        latency=statistics.fmean(run.latencies),
        p10=percentile(run.latencies, 10) or 0.0,
        p90=percentile(run.latencies, 90) or 0.0,
        outside=outside,
    )


def cycles(
    runs: list[LevelResult], paths: list[str] | None, min_streams: int
) -> dict[LevelKey, dict[str, list[Cycle]]]:
    """(max_tokens, concurrency, stagger, slices) -> path -> its rounds' cycles, in the runs' order."""
    found: dict[LevelKey, dict[str, list[Cycle]]] = {}
    for run in runs:
        if run.concurrency < min_streams or (paths and run.path not in paths) or run.background_load:
            continue
        cycle = cycle_of(run)
        if cycle is not None:
            level = (run.max_tokens, run.concurrency, run.stagger_seconds, run.slices)
            found.setdefault(level, {}).setdefault(run.path, []).append(cycle)
    return found


def _ms(values: list[float | None]) -> str:
    return " / ".join("-" if v is None else f"{1000 * v:.0f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--paths", help="PATH,PATH...: only these (default: every path)")
    parser.add_argument("--min-streams", type=int, default=16, help="levels of at least this many streams")
    args = parser.parse_args(argv)
    paths = args.paths.split(",") if args.paths else None
    runs = [run for file in args.files for run in runs_of(read(file))]
    found = cycles(runs, paths, args.min_streams)
    if not found:
        print("no level with its requests' latencies matched", file=sys.stderr)
        return 1
    print(
        "ms per round: cycle (a stream's time per request) = mean latency + between requests; latency p10-p90;"
        " outside: of the cycle, out of the engine's batch (profiled rounds)"
    )
    for (max_tokens, concurrency, stagger, slices), by_path in sorted(found.items()):
        out_of_step = f", out of step by {stagger:g} s" if stagger else ""
        sliced = f", in {slices} slices" if slices > 1 else ""
        print(f"{max_tokens} tokens x {concurrency} streams{out_of_step}{sliced}")
        for path, rounds in sorted(by_path.items()):
            outside = [c.outside for c in rounds]
            print(
                f"  {path:<24} cycle {_ms([c.cycle for c in rounds])}  latency {_ms([c.latency for c in rounds])}"
                f"  between {_ms([c.between for c in rounds])}"
                f"  p10-p90 {min(c.p10 for c in rounds) * 1000:.0f}-{max(c.p90 for c in rounds) * 1000:.0f}"
                + (f"  outside {_ms(outside)}" if any(v is not None for v in outside) else "")
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
