"""A pair of paths' paired ratio over every round of several benchmark runs, pooled per level.

    .venv/bin/python tools/pool_rounds.py FILE... [--pair bare,plain-grpc]... [--below 0.95] [--min-streams 64]
        [--each] [--by-speed N]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz. A round is one repetition of a level in
one interleaved command (the two paths measured seconds apart); each round where both paths ran gives one ratio
(the second path's tok/s over the first's). Per level: the rounds, their median, range, and how many fall below
--below. What one command's three repetitions cannot say, many rounds of the same serving code can: whether a cell
trails in most rounds or only in some. Then every level together (waves apart from out of step): the geometric mean
of the rounds' ratios with +-2 standard errors, a round's spread within its level (the standard deviation of the log
ratio about its level's mean), and at that spread how often a path exactly as fast as the other would get a median
of three rounds at or above --below (the benchmark's verdict on one cell); then the same for each number of streams,
so that a gap at one load is not averaged away by the others. Each level's line also gives its own geometric mean
+-2 standard errors at that pooled spread (a level's few rounds say little of their own spread). Streams started out
of step (--stagger-seconds) are another workload than waves: their rounds pool apart from the waves' of the same level.
Where both paths of a round were profiled (--profile), the engine's mean batch and step time of the one over the
other's, pooled the same way: a round's tok/s ratio is about the batch ratio over the step-time ratio, and the batch
hardly moves with the machine's slow spells, which lengthen the steps.
--pair again for more pairs (a variant's model beside the deployment's: --pair plain-grpc,extra:c15_vllm_model);
--each also lists every round's ratio, file by file. --below 0.9 for the streamed pair's target. A path measured with
different clients in different files (bare-delayed's holds: 0 ms is the bare engine against itself) is noted under
its pair: pass the files of one client to keep them apart.
--by-speed N also splits each level's rounds into N groups by how fast the pair ran (the machine's speed moves from
round to round): per group the ratio and how many ms longer a request of the second path took. A cost fixed per
request (or per wave) keeps its ms and lowers the ratio as the machine gets faster; a proportional one keeps the ratio.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench_results import runs_of  # noqa: E402
from tools.pair_spread import read, rounds_of  # noqa: E402

Level = tuple[int, int, float]  # max_tokens, concurrency, stagger_seconds (0: waves)


def stagger_of(doc: dict) -> float:
    """The file's --stagger-seconds (one per file: the bench's --merge refuses to mix them)."""
    return max((run.stagger_seconds for run in runs_of(doc)), default=0.0)


def pooled_rates(docs: list[dict], first: str, second: str, min_streams: int) -> dict[Level, list[tuple[float, float]]]:
    """(max_tokens, concurrency, stagger) -> each round's tok/s of `first` and of `second`, in the files' order."""
    pooled: dict[Level, list[tuple[float, float]]] = defaultdict(list)
    for doc in docs:
        stagger = stagger_of(doc)
        for (max_tokens, concurrency, _), paths in sorted(rounds_of(doc).items()):
            if concurrency >= min_streams and first in paths and second in paths:
                pooled[(max_tokens, concurrency, stagger)].append((paths[first][1], paths[second][1]))
    return pooled


def clients_across(docs: list[dict], path: str) -> dict[str, int]:
    """The clients `path` was measured with (its results' recorded `client`), each with how many of the files hold
    runs of it. A path means another measurement with another client: bare-delayed's client names its hold
    (tools/bench_paths.py's recorded_client), so 0 ms (the bare engine against itself) and 60 ms are different
    pairs. Files written before clients were recorded count as none."""
    counts: dict[str, int] = defaultdict(int)
    for doc in docs:
        for client in {run.client for run in runs_of(doc) if run.path == path and run.client is not None}:
            counts[client] += 1
    return dict(counts)


def pooled_ratios(docs: list[dict], first: str, second: str, min_streams: int) -> dict[Level, list[float]]:
    """(max_tokens, concurrency, stagger) -> each round's tok/s of `second` over `first`, in the files' order."""
    return ratios_of(pooled_rates(docs, first, second, min_streams))


def ratios_of(rates: dict[Level, list[tuple[float, float]]]) -> dict[Level, list[float]]:
    return {level: [b / a for a, b in own] for level, own in rates.items()}


@dataclass(frozen=True)
class SpeedGroup:
    """Rounds of one level whose pair ran at about the same speed (the two paths' geometric mean tok/s)."""

    slowest: float
    fastest: float
    rounds: int
    geometric_mean: float  # of the ratio second / first
    extra_ms: float  # a stream's mean time per request, second's minus first's


def by_speed(level: Level, rates: list[tuple[float, float]], groups: int) -> list[SpeedGroup]:
    """The level's rounds in `groups` groups by the pair's speed, slowest first. The speed is the geometric mean of
    both paths' tok/s, not the first's alone: noise in the first path's rate would otherwise pull the ratio down in
    its fast rounds by itself. A cost fixed per request (or per wave of them) shows as the same extra ms in every
    group and a ratio that falls as the machine runs faster; a cost in proportion to the work, as the same ratio."""
    max_tokens, concurrency, _ = level
    ordered = sorted(rates, key=lambda pair: pair[0] * pair[1])
    out = []
    for index in range(groups):
        own = ordered[index * len(ordered) // groups : (index + 1) * len(ordered) // groups]
        if not own:
            continue
        speeds = [math.sqrt(a * b) for a, b in own]
        # every stream has one request in flight: its time per request is streams x tokens / tok/s
        extra = [1000 * concurrency * max_tokens * (1 / b - 1 / a) for a, b in own]
        out.append(
            SpeedGroup(
                slowest=min(speeds),
                fastest=max(speeds),
                rounds=len(own),
                geometric_mean=math.exp(statistics.fmean(math.log(b / a) for a, b in own)),
                extra_ms=statistics.fmean(extra),
            )
        )
    return out


ENGINE_FIGURES = ("mean batch", "step time")


def engine_ratios(docs: list[dict], first: str, second: str, min_streams: int) -> dict[str, dict[Level, list[float]]]:
    """--profile's engine figures of the rounds where both paths were profiled: each round's mean batch (requests in
    a step) and step time (the round's wall over its steps, LevelResult.level_steps) of `second` over `first`, per
    level. A round's tok/s ratio is about the one over the other: these tell an emptier batch from slower steps, and
    the batch hardly moves with the machine's slow spells, which lengthen the steps."""
    pooled: dict[str, dict[Level, list[float]]] = {figure: defaultdict(list) for figure in ENGINE_FIGURES}
    for doc in docs:
        stagger = stagger_of(doc)
        figures: dict[tuple[int, int, str], dict[str, tuple[float, float]]] = defaultdict(dict)
        for run in runs_of(doc):
            steps = run.level_steps()
            if run.round_id and not run.background_load and steps and run.concurrency >= min_streams:
                batch = run.engine_steps["running_mean"]  # type: ignore[index] - counted steps mean it is there
                figures[(run.max_tokens, run.concurrency, run.round_id)][run.path] = (batch, run.wall / steps)
        for (max_tokens, concurrency, _), paths in sorted(figures.items()):
            if first in paths and second in paths:
                for index, figure in enumerate(ENGINE_FIGURES):
                    pooled[figure][(max_tokens, concurrency, stagger)].append(
                        paths[second][index] / paths[first][index]
                    )
    return pooled


@dataclass(frozen=True)
class Pooled:
    """Every level's rounds together, each round's log ratio taken about its level's mean for the spread."""

    rounds: int
    geometric_mean: float
    low: float  # the geometric mean at -2 standard errors (over all the rounds)
    high: float
    spread: float  # the standard deviation of a round's log ratio within its level
    equal_meets: float  # the chance a path exactly as fast gets a median of 3 rounds >= the threshold, at that spread


def pooled_over_levels(levels: list[list[float]], threshold: float) -> Pooled | None:
    """None with fewer than two rounds beyond one per level (no spread within a level to go by)."""
    logs = [[math.log(r) for r in ratios] for ratios in levels if ratios]
    rounds = sum(len(own) for own in logs)
    freedom = rounds - len(logs)
    if freedom < 2:
        return None
    spread = math.sqrt(sum((x - statistics.fmean(own)) ** 2 for own in logs for x in own) / freedom)
    everything = [x for own in logs for x in own]
    centre = statistics.fmean(everything)
    error = statistics.stdev(everything) / math.sqrt(rounds)
    # a median of three at or above the threshold: two or three of the rounds are
    above = 1 - statistics.NormalDist(0, spread).cdf(math.log(threshold)) if spread > 0 else 1.0
    return Pooled(
        rounds=rounds,
        geometric_mean=math.exp(centre),
        low=math.exp(centre - 2 * error),
        high=math.exp(centre + 2 * error),
        spread=spread,
        equal_meets=3 * above**2 * (1 - above) + above**3,
    )


def level_mean(ratios: list[float], spread: float) -> tuple[float, float, float]:
    """One level's geometric mean with +-2 standard errors, at the spread pooled over its group's levels (a level
    alone has too few rounds for its own)."""
    centre = statistics.fmean(math.log(r) for r in ratios)
    error = spread / math.sqrt(len(ratios))
    return math.exp(centre), math.exp(centre - 2 * error), math.exp(centre + 2 * error)


def in_step_groups(by_level: dict[Level, list[float]]) -> dict[bool, dict[Level, list[float]]]:
    """Waves (True) apart from streams out of step (False): another workload, pooled apart."""
    return {in_step: {lv: r for lv, r in by_level.items() if (lv[2] == 0) == in_step} for in_step in (True, False)}


def per_streams(group: dict[Level, list[float]], name: str) -> list[tuple[str, list[list[float]]]]:
    """A group's levels per number of streams, where it holds several (a gap at one load that the others hide in
    the mean of all); none where it holds one."""
    streams = sorted({concurrency for _, concurrency, _ in group})
    if len(streams) < 2:
        return []
    return [(f"{name} at {c} streams", [r for (_, at, _), r in group.items() if at == c]) for c in streams]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--pair",
        action="append",
        help="FIRST,SECOND: the ratio is SECOND / FIRST (again for more pairs; default bare,plain-grpc)",
    )
    parser.add_argument("--below", type=float, default=0.95, help="count the rounds whose ratio is below this")
    parser.add_argument("--min-streams", type=int, default=1, help="levels of at least this many streams")
    parser.add_argument("--each", action="store_true", help="also every round's ratio, file by file")
    parser.add_argument(
        "--by-speed",
        type=int,
        default=0,
        metavar="N",
        help="also each level's rounds in N groups by how fast the pair ran: a fixed cost per request against a"
        " proportional one",
    )
    args = parser.parse_args(argv)
    pairs = []
    for pair in args.pair or ["bare,plain-grpc"]:
        first, _, second = pair.partition(",")
        if not first or not second:
            parser.error(f"--pair takes two paths: FIRST,SECOND (got {pair!r})")
        pairs.append((first, second))
    docs = [read(f) for f in args.files]
    missing = 0
    for first, second in pairs:
        rates = pooled_rates(docs, first, second, args.min_streams)
        pooled = ratios_of(rates)  # per level, the files' rounds in the files' order
        per_file = [pooled_ratios([doc], first, second, args.min_streams) for doc in docs] if args.each else []
        if not pooled:
            print(f"no round measured both {first} and {second}", file=sys.stderr)
            missing += 1
            continue
        print(f"{second} / {first} per round, pooled over {len(args.files)} file(s)")
        for path in (first, second):
            clients = clients_across(docs, path)
            if len(clients) > 1:  # pooled all the same, but not the same measurement: say so
                measured = ", ".join(f"{client} ({files} file(s))" for client, files in sorted(clients.items()))
                print(f"  note: {path} was measured with different clients, pooled together here: {measured}")
        groups = in_step_groups(pooled)
        together = {in_step: pooled_over_levels(list(group.values()), args.below) for in_step, group in groups.items()}
        for level, ratios in sorted(pooled.items()):
            max_tokens, concurrency, stagger = level
            out_of_step = f" out of step by {stagger:g} s" if stagger else ""
            own = together[stagger == 0]
            interval = ""
            if own is not None:
                mean, low, high = level_mean(ratios, own.spread)
                interval = f", geometric mean {mean:.3f} ({low:.3f}-{high:.3f})"
            print(
                f"  {max_tokens} tokens x {concurrency} streams{out_of_step}: {len(ratios)} rounds, median"
                f" {statistics.median(ratios):.3f}, {min(ratios):.2f}-{max(ratios):.2f},"
                f" {sum(r < args.below for r in ratios)} below {args.below}{interval}"
            )
            if args.each:
                for file, own_rounds in zip(args.files, per_file, strict=True):
                    if level in own_rounds:
                        print(f"    {file.name}: {' '.join(f'{r:.2f}' for r in own_rounds[level])}")
            if args.by_speed:
                for group in by_speed(level, rates[level], args.by_speed):
                    print(
                        f"    pair at {group.slowest:.0f}-{group.fastest:.0f} tok/s: {group.rounds} rounds, geometric"
                        f" mean {group.geometric_mean:.3f}, a request {group.extra_ms:+.0f} ms"
                    )
        for in_step, group in groups.items():
            name = "waves" if in_step else "out of step"
            pooled_group = together[in_step]
            if pooled_group is None:
                continue
            print(
                f"  {name}, {len(group)} level(s) together: {pooled_group.rounds} rounds, geometric mean"
                f" {pooled_group.geometric_mean:.3f} ({pooled_group.low:.3f}-{pooled_group.high:.3f}, +-2 standard"
                f" errors); a round's spread within its level {pooled_group.spread:.3f} (sd of the log ratio): a path"
                f" as fast as {first} gets a median of 3 rounds >= {args.below} in"
                f" {100 * pooled_group.equal_meets:.0f} % of levels"
            )
            for label, levels in per_streams(group, name):
                at = pooled_over_levels(levels, args.below)
                if at is not None:
                    print(
                        f"    {label}: {at.rounds} rounds, geometric mean {at.geometric_mean:.3f}"
                        f" ({at.low:.3f}-{at.high:.3f})"
                    )
        print_engine_figures(engine_ratios(docs, first, second, args.min_streams))
    return 1 if missing else 0  # a pair no round measured: most likely a misspelt path


def print_engine_figures(figures: dict[str, dict[Level, list[float]]]) -> None:
    """Per group (waves, out of step), and per number of streams where it holds several: the profiled rounds' engine
    figures, each pooled as the tok/s ratios are."""
    groups = {figure: in_step_groups(by_level) for figure, by_level in figures.items()}
    for in_step in (True, False):
        name = "waves" if in_step else "out of step"
        # each figure's selections line up: both figures come from the same rounds
        selections = {
            figure: [(name, list(groups[figure][in_step].values())), *per_streams(groups[figure][in_step], name)]
            for figure in ENGINE_FIGURES
        }
        for index, (label, _) in enumerate(selections[ENGINE_FIGURES[0]]):
            parts, rounds = [], 0
            for figure in ENGINE_FIGURES:
                pooled = pooled_over_levels(selections[figure][index][1], threshold=1.0)
                if pooled is not None:
                    rounds = pooled.rounds
                    parts.append(f"{figure} {pooled.geometric_mean:.3f} ({pooled.low:.3f}-{pooled.high:.3f})")
            if parts:
                print(f"  the engine, {label}, {rounds} profiled rounds: " + ", ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
