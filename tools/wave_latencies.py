"""A level's requests wave by wave: how much longer each path's took than a reference path's in the same wave.

    .venv/bin/python tools/wave_latencies.py FILE... [--reference bare] [--paths plain-grpc,stream-grpc]
        [--min-streams 16]

FILE: tools/bench.py's results.json, or one of docs/gpu-bench-ab/*.json.xz. In waves (a level's streams start
together and every request generates max_tokens) a stream's k-th requests go out and finish together, wave after
wave; with --interleave and --wave-slices the paths take turns every few waves, so one round's same wave of two paths
was measured seconds apart. Per level and path: the median over every round's waves of the path's mean latency in a
wave less the reference's in the same wave (ms), their range, and the median wave of each. The machine's slow spells
(a few seconds) lengthen a wave or two of whichever path they fall on; the median over the waves leaves them out
where a level's ratio of tokens per second keeps them. Read side by side at two max_tokens, it tells a cost per
request (the same ms) from a cost per token (ms growing with the tokens).

Each request's wave is recorded since bench_clients.Sample.wave. Results written before are read by the order
tools/bench.py writes the latencies in: a level's slices one after the other (level_slices: whole waves each, any
rest with the last), within a slice each client process's requests in turn (the in-process client's all at once),
each in the order they finished, so a process's n-th finished request of S streams counts as wave n // S; the client
processes are read from the command that measured the round (--client-processes). Levels out of step
(--stagger-seconds) have no waves and are left out.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.bench import build_parser  # noqa: E402
from tools.bench_clients import slice_shares, split  # noqa: E402
from tools.bench_results import LevelResult, runs_of  # noqa: E402
from tools.pair_spread import read  # noqa: E402

IN_PROCESS = "in-process"  # the bare paths' client (bench_paths): one process, its requests in one list
# file index, round_id, max_tokens, concurrency: one round of one level, where paths' waves pair
RoundKey = tuple[int, str, int, int]


def client_processes(doc: dict[str, Any], round_id: str) -> int:
    """--client-processes of the command that measured round `round_id` ("command.repetition"), as bench.py's own
    parser reads it (pair_spread reads older commands so too); 1 when the command is not in the file."""
    commands = doc.get("commands") or []
    try:
        command = commands[int(str(round_id).split(".")[0])]["command"]
    except (ValueError, IndexError, KeyError, TypeError):
        return 1
    args, _ = build_parser().parse_known_args(shlex.split(command)[1:])  # options of today's bench only
    return args.client_processes


def waves_by_layout(run: LevelResult, processes: int) -> list[int]:
    """Each latency's wave, from the order tools/bench.py writes a level's latencies in (the module's docstring)."""
    concurrency = max(1, run.concurrency)
    busy = max(1, min(processes, concurrency))  # as ProcessPoolRunner.prepare: no process without a stream
    waves: list[int] = []
    offset = 0
    for share in slice_shares(run.requests, concurrency, run.slices):
        last = -1
        for streams, requests in zip(split(concurrency, busy), split(share, busy), strict=True):
            local = [n // streams for n in range(requests)]
            waves += [offset + wave for wave in local]
            last = max([last, *local])
        offset += last + 1
    return waves[: len(run.latencies)]


def wave_means(run: LevelResult, processes: int) -> dict[int, float]:
    """Wave -> the mean latency of its requests, in seconds."""
    client_count = 1 if run.client == IN_PROCESS else processes
    waves = run.waves if len(run.waves) == len(run.latencies) else waves_by_layout(run, client_count)
    by_wave: dict[int, list[float]] = defaultdict(list)
    for wave, latency in zip(waves, run.latencies, strict=False):
        by_wave[wave].append(latency)
    return {wave: statistics.fmean(values) for wave, values in by_wave.items()}


def rounds_by_wave(docs: list[dict[str, Any]], min_streams: int) -> dict[RoundKey, dict[str, dict[int, float]]]:
    """Each round of each level in waves: path -> wave -> mean latency."""
    found: dict[RoundKey, dict[str, dict[int, float]]] = defaultdict(dict)
    for index, doc in enumerate(docs):
        for run in runs_of(doc):
            if run.concurrency < min_streams or run.stagger_seconds or run.background_load or not run.latencies:
                continue
            key = (index, str(run.round_id), run.max_tokens, run.concurrency)
            found[key][run.path] = wave_means(run, client_processes(doc, run.round_id))
    return found


def extra_ms(
    found: dict[RoundKey, dict[str, dict[int, float]]], reference: str, paths: list[str] | None
) -> dict[tuple[int, int], dict[str, tuple[list[float], list[float]]]]:
    """(max_tokens, concurrency) -> path -> (its waves' ms over the reference's same wave, its waves' mean ms)."""
    out: dict[tuple[int, int], dict[str, tuple[list[float], list[float]]]] = defaultdict(dict)
    for (_, _, max_tokens, concurrency), by_path in found.items():
        base = by_path.get(reference)
        if base is None:
            continue
        for path, means in by_path.items():
            if path != reference and paths and path not in paths:
                continue
            extras, own = out[(max_tokens, concurrency)].setdefault(path, ([], []))
            for wave, mean in means.items():
                if wave in base:
                    extras.append(1000 * (mean - base[wave]))
                    own.append(1000 * mean)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--reference", default="bare", help="the path each is held against (default: bare)")
    parser.add_argument("--paths", help="PATH,PATH...: only these beside the reference (default: every path)")
    parser.add_argument("--min-streams", type=int, default=16, help="levels of at least this many streams")
    args = parser.parse_args(argv)
    paths = args.paths.split(",") if args.paths else None
    table = extra_ms(rounds_by_wave([read(f) for f in args.files], args.min_streams), args.reference, paths)
    if not any(table.values()):
        print(f"no level in waves with {args.reference} and its latencies matched", file=sys.stderr)
        return 1
    print(
        f"ms per wave, median over the rounds' waves: a path's mean latency in a wave less {args.reference}'s in the"
        " same wave (range); the median wave"
    )
    for (max_tokens, concurrency), by_path in sorted(table.items()):
        print(f"{max_tokens} tokens x {concurrency} streams")
        for path, (extras, own) in sorted(by_path.items(), key=lambda item: (item[0] != args.reference, item[0])):
            if not own:
                continue
            if path == args.reference:
                print(f"  {path:<24} {len(own)} waves, median wave {statistics.median(own):.0f} ms")
                continue
            print(
                f"  {path:<24} {statistics.median(extras):+.0f} ms ({min(extras):+.0f}..{max(extras):+.0f})"
                f" over {len(extras)} waves, median wave {statistics.median(own):.0f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
