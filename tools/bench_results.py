"""The benchmark's results (tools/bench.py): one measured level of one path (LevelResult), OUT/results.json and
its rounds, and the report read from them: the table, the issue's targets, the machine's spread and load, the plot.
Apart from running the benchmark, so the tools that read a results file (pool_rounds, request_cycles, cpu_busy)
need none of it (pair_spread still asks bench.py's parser how an older command ordered its paths)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tools.bench_paths import BARE_DELAY_MS, baseline_of, recorded_client
from tools.machine_facts import cpu_time_delta, interrupt_delta, machine_facts, read_cpu_times, read_interrupts


@dataclass
class LevelResult:
    path: str
    max_tokens: int
    concurrency: int
    rep: int
    requests: int
    wall: float
    output_tokens: int
    cpu_seconds: float | None
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    client_cpu_seconds: float | None = None
    # --profile: per server process (name -> CPU seconds) and Triton's per-model statistics over the level
    process_cpu: dict[str, float] | None = None
    triton_stats: dict[str, dict[str, float]] | None = None
    # --profile: the engine's own steps over the level (core/step_stats.py): its batch, steps per second
    engine_steps: dict[str, Any] | None = None
    # --profile: the trips to and from the EngineCore by its clock (core/engine_lags.py), mean ms
    engine_lags: dict[str, Any] | None = None
    # --profile: the core's own counter lines logged over the level (core/core_stats.py: its intake, sends, and where
    # each first response waited), as logged
    core_stats: list[str] | None = None
    # "command.repetition" of the results file: runs of the same round were measured in one command's same
    # repetition, so their ratio is paired (with --interleave, seconds apart)
    round_id: str = ""
    # the client it was measured with (PATH_CLIENTS); None in results written before clients were recorded
    client: str | None = None
    # --stagger-seconds: the streams' starts spread over this many seconds (0: together, as every run before it)
    stagger_seconds: float = 0.0
    # --background-load: busy processes running while the level was measured (0 in a paused repetition of
    # --background-load-alternate)
    background_load: int = 0
    # --interleave: its place in the turn of the paths (turn_order; None: not interleaved, or an older bench)
    turn_index: int | None = None
    # --one-stream-slices, --wave-slices: the level was measured in this many slices, the turn once per slice, and
    # this result adds up its path's slices (1: the whole level at once, as every run before)
    slices: int = 1
    # the GPU's clocks, power and temperature while it was measured (tools/gpu_clocks.py; None without nvidia-smi,
    # or in results written before they were recorded); a sliced level's slices together
    gpu_clocks: dict[str, Any] | None = None
    # --cpu-busy: how many CPUs (the engine's loop's left out) were busy at once while it was measured
    # (tools/cpu_busy.py); None without the flag, or for a level shorter than two readings (~40 ms)
    cpu_busy: dict[str, Any] | None = None
    # each request's wave (bench_clients.Sample.wave; a sliced level's numbered on over its slices), in the
    # latencies' order; [] in results written before they were recorded (tools/wave_latencies.py)
    waves: list[int] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.wall

    def engine_share(self) -> float:
        """The share of --profile's engine figures that is this level's: the level's tokens over those the engine
        generated in the intervals counted. A core logs an interval per front end every CORE_STATS_SECONDS
        (bench.py), so the first ones also hold some of the level's warm-up round, just before it (1-3 % of the steps
        at 256 streams, 7-10 % at 64 x 64 tokens on the H200); the bare engine counts the level alone (1)."""
        generated = (self.engine_steps or {}).get("generation_tokens")
        return min(1.0, self.output_tokens / generated) if generated else 1.0

    def level_steps(self) -> float | None:
        """The engine's steps in this level (--profile), its counted steps scaled by engine_share; None uncounted."""
        steps = (self.engine_steps or {}).get("steps")
        return steps * self.engine_share() if steps else None


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


# Results -------------------------------------------------------------------------------------------------


def load_runs(results_file: Path) -> list[LevelResult]:
    return runs_of(json.loads(results_file.read_text())) if results_file.exists() else []


def runs_of(doc: dict[str, Any]) -> list[LevelResult]:
    known = {f.name for f in fields(LevelResult)}
    return [LevelResult(**{k: v for k, v in run.items() if k in known}) for run in doc.get("runs", [])]


class ResultsFile:
    """OUT/results.json, rewritten (atomically) after every measured level: a command stopped by a time limit or a
    crashed server keeps what it measured, and a later `--merge` command goes on from there. With `merge`, the
    runs already in the file stay and this command's repetitions continue their numbering per path and level, so a
    repetition split over commands by `--levels` (one command's time limit) numbers like one."""

    def __init__(
        self,
        path: Path,
        merge: bool,
        command: str,
        deployment: str,
        paths: Collection[str] = (),
        stagger_seconds: float = 0.0,
        bare_delay_ms: float = BARE_DELAY_MS,
    ) -> None:
        self.path = path
        self.bare_delay_ms = bare_delay_ms
        earlier = json.loads(path.read_text()) if merge and path.exists() else {}
        self.earlier = runs_of(earlier)
        staggers = sorted({r.stagger_seconds for r in self.earlier} - {stagger_seconds})
        if staggers:  # another workload: waves of requests, or streams out of step, are not one level's repetitions
            raise SystemExit(
                f"bench: --merge: {path} holds runs with --stagger-seconds {', '.join(map(str, staggers))}, this"
                f" command's is {stagger_seconds}; write to another --out"
            )
        for measured in paths:  # the paths this command will measure: one client per path and file
            client = recorded_client(measured, bare_delay_ms)
            others = sorted({str(r.client) for r in self.earlier if r.path == measured and r.client != client})
            if others:
                raise SystemExit(
                    f"bench: --merge: {path} holds runs of {measured} measured with client {', '.join(others)}"
                    f" (None: not recorded, an older bench), this command's is {client}; write to another --out"
                )
        earlier_commands = earlier.get("commands", []) if self.earlier else []
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # The machine it ran on, with each command: a merged run may span several (tools/machine_facts.py)
        this = {"command": command, "started": started, "machine": machine_facts()}
        self.commands = [*earlier_commands, this]
        self._interrupts_at_start = read_interrupts()
        self._cpu_times_at_start = read_cpu_times()
        self.deployment = deployment
        self.results: list[LevelResult] = []

    def _earlier_repetitions(self, max_tokens: int, concurrency: int, path: str | None = None) -> int:
        """How many repetitions of a level (of one path; None: its most measured one) the merged file holds."""
        return 1 + max(
            (
                r.rep
                for r in self.earlier
                if (r.max_tokens, r.concurrency) == (max_tokens, concurrency) and path in (None, r.path)
            ),
            default=-1,
        )

    def repetitions_done(self, level: dict[str, Any]) -> int:
        """How many repetitions of `level` the merged file already holds (schedule's alternation goes on from it)."""
        return self._earlier_repetitions(level["max_tokens"], level["concurrency"])

    def repetitions_lacking(self, level: dict[str, Any], paths: Collection[str], target: int) -> int:
        """--fill-to: the repetitions `level` needs so that every one of `paths` has `target` in the merged file
        (counted by its least measured path: a level that a stopped command left with a partial round gets that
        round again on every path, so that each pair has a round of its own)."""
        have = min(
            (self._earlier_repetitions(level["max_tokens"], level["concurrency"], path) for path in paths), default=0
        )
        return max(0, target - have)

    def add(self, result: LevelResult) -> None:
        result.client = recorded_client(result.path, self.bare_delay_ms)
        result.round_id = f"{len(self.commands) - 1}.{result.rep}"
        result.rep += self._earlier_repetitions(result.max_tokens, result.concurrency, result.path)
        self.results.append(result)
        self.write()

    def document(self) -> dict[str, Any]:
        everything = self.earlier + self.results
        self.commands[-1]["interrupts"] = interrupt_delta(self._interrupts_at_start, read_interrupts())
        self.commands[-1]["cpu_time"] = cpu_time_delta(self._cpu_times_at_start, read_cpu_times())
        return {
            "commands": self.commands,
            "deployment": self.deployment,
            **judged(everything),
            "runs": [asdict(r) for r in everything],
        }

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.document(), indent=1))
        partial.replace(self.path)


def judged(runs: list[LevelResult]) -> dict[str, Any]:
    """What a run's runs say: the table's rows, the targets, the machine's spread and the background load's effect."""
    rows = summarize(runs)
    return {
        "summary": rows,
        "targets": target_lines(rows),
        "noise": noise_lines(runs),
        "background_load": load_lines(runs),
    }


def summarize(results: list[LevelResult]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r.path, r.max_tokens, r.concurrency) for r in results}, key=lambda k: (k[1], k[0], k[2]))
    tps: dict[tuple[str, int, int], list[float]] = {}
    by_round = tokens_per_round(results)
    for r in results:
        tps.setdefault((r.path, r.max_tokens, r.concurrency), []).append(r.tokens_per_second)
    for path, max_tokens, concurrency in keys:
        reps = [r for r in results if (r.path, r.max_tokens, r.concurrency) == (path, max_tokens, concurrency)]
        mine = tps[(path, max_tokens, concurrency)]
        latencies = [x for r in reps for x in r.latencies]
        ttfts = [x for r in reps for x in r.ttfts]
        cpu = [r.cpu_seconds / r.output_tokens * 1000 for r in reps if r.cpu_seconds is not None]
        client = [r.client_cpu_seconds / r.wall for r in reps if r.client_cpu_seconds is not None]
        base = tps.get((baseline_of(path), max_tokens, concurrency))
        profiled = [(r, r.engine_steps) for r in reps if r.engine_steps]  # --profile's engine figures
        steps = [x for _, x in profiled]
        detailed = [x for x in steps if x.get("detailed_steps")]  # with vLLM's iteration details
        series = paired_series(by_round.get((max_tokens, concurrency), {}), path)
        against_baseline = series.get(baseline_of(path))
        rows.append(
            {
                "path": path,
                "max_tokens": max_tokens,
                "concurrency": concurrency,
                "reps": len(reps),
                "tokens_per_s": statistics.median(mine),
                "tokens_per_s_min": min(mine),
                "tokens_per_s_max": max(mine),
                "requests_per_s": statistics.median(r.requests / r.wall for r in reps),
                "baseline": baseline_of(path),
                "ratio": statistics.median(mine) / statistics.median(base) if base else None,
                # the median of this path's tok/s over the baseline's in the same rounds (see LevelResult.round_id)
                "paired_ratio": statistics.median(against_baseline) if against_baseline else None,
                "paired_series": series,  # other path -> each common round's ratio, in round order
                "ttft_p50_ms": _ms(percentile(ttfts, 50)),
                "ttft_p99_ms": _ms(percentile(ttfts, 99)),
                "e2e_p50_ms": _ms(percentile(latencies, 50)),
                "e2e_p99_ms": _ms(percentile(latencies, 99)),
                "cpu_s_per_1k_tokens": statistics.median(cpu) if cpu else None,
                "client_cores": statistics.median(client) if client else None,
                "engine_running_mean": statistics.median(x["running_mean"] for x in steps) if steps else None,
                "engine_steps_per_s": _median_of([x["steps_per_second"] for x in steps]),
                # the round's wall time over the engine's steps in it: known for a core with several front ends too
                "engine_step_ms": _median_of([r.wall * 1000 / n for r, _ in profiled if (n := r.level_steps())]),
                # prompt tokens the model computed per request, and the prefix cache's share of those queried
                "engine_prompt_computed": _median_of(
                    [
                        x["computed_prompt_tokens"] * r.engine_share() / r.requests
                        for r, x in profiled
                        if x.get("computed_prompt_tokens")
                    ]
                ),
                "engine_cache_hit_share": _median_of(
                    [x["cache_hits"] / x["cache_queries"] for x in steps if x.get("cache_queries")]
                ),
                **engine_lag_columns([r.engine_lags for r in reps if r.engine_lags]),
                **engine_detail_columns(detailed),
                "triton_models": triton_model_columns([r.triton_stats for r in reps if r.triton_stats]),
            }
        )
    return rows


def tokens_per_round(results: list[LevelResult]) -> dict[tuple[int, int], dict[str, dict[str, float]]]:
    """Level (max_tokens, concurrency) -> path -> round -> tok/s, for the runs that belong to a round."""
    by_round: dict[tuple[int, int], dict[str, dict[str, float]]] = {}
    for r in results:
        if r.round_id:
            by_round.setdefault((r.max_tokens, r.concurrency), {}).setdefault(r.path, {})[r.round_id] = (
                r.tokens_per_second
            )
    return by_round


def round_order(round_id: str) -> tuple[int, ...]:
    """LevelResult.round_id ("command.repetition") as numbers: "10.0" after "2.1"."""
    return tuple(int(part) for part in round_id.split("."))


def paired_series(rounds: dict[str, dict[str, float]], path: str) -> dict[str, list[float]]:
    """For one level, `path`'s tok/s over each other path's in every round in which both were measured, in round
    order (path -> round -> tok/s); the paired ratio is their median."""
    mine = rounds.get(path, {})
    series = {}
    for other, theirs in rounds.items():
        common = sorted(set(mine) & set(theirs), key=round_order)
        if other != path and common:
            series[other] = [mine[r] / theirs[r] for r in common]
    return series


def engine_detail_columns(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the repetitions of what vLLM's iteration details add (core/step_stats.py): the share of
    steps that computed prompt tokens, the decode-only steps' rate, and the EngineCore's wait for the model's
    result per decode step (the rest of a decode step's time is the EngineCore's own CPU work)."""

    return {
        "engine_prefill_share": _median_of([x["prefill_steps"] / x["detailed_steps"] for x in steps]),
        "engine_decode_steps_per_s": _median_of([x["decode_steps_per_second"] for x in steps]),
        "engine_decode_wait_ms": _median_of([x["decode_wait_ms"] for x in steps]),
    }


def triton_model_columns(stats: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per model of the server (--profile's Triton statistics), medians over the repetitions of a request's mean
    wait in Triton's queue and in the model's `execute`, and of the requests per `execute` (above 1 only where
    Triton batches the model's requests): where a request waits before it reaches the model's code."""
    columns = {}
    for model in sorted({model for level in stats for model in level}):
        counted = [
            level[model]
            for level in stats
            if all(level.get(model, {}).get(key) for key in ("queue_count", "compute_infer_count", "executions"))
        ]
        if counted:
            columns[model] = {
                "queue_ms": statistics.median(x["queue_ms"] / x["queue_count"] for x in counted),
                "execute_ms": statistics.median(x["compute_infer_ms"] / x["compute_infer_count"] for x in counted),
                "per_execute": statistics.median(x["success_count"] / x["executions"] for x in counted),
            }
    return columns


def _median_of(values: list[float | None]) -> float | None:
    """The median of the known values (a rate is None from a core with several front ends, core/step_stats.py)."""
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def engine_lag_columns(lags: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over the repetitions of the mean trips to and from the EngineCore and of the time inside it
    (core/engine_lags.py); a repetition that counted none of a mean's items is left out of that median."""

    def median(key: str, count: str) -> float | None:
        counted = [x[key] for x in lags if x.get(count)]  # results of runs before the split have no "finished"
        return statistics.median(counted) if counted else None

    return {
        "engine_intake_ms": median("intake_ms", "requests"),
        "engine_handover_ms": median("handover_ms", "handed"),
        "engine_return_ms": median("return_ms", "outputs"),
        "engine_queue_ms": median("queue_ms", "finished"),
        "engine_prefill_ms": median("prefill_ms", "finished"),
        "engine_token_ms": median("token_ms", "finished"),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'path':<22}{'max_tok':>8}{'conc':>6}{'tok/s':>9}{'spread':>15}{'ratio':>7}{'paired':>7}{'req/s':>8}"
        f"{'ttft50':>8}{'ttft99':>8}{'e2e50':>8}{'e2e99':>8}{'cpu/1k':>8}{'client':>7}"
    )
    for row in rows:
        spread = f"{row['tokens_per_s_min']:.0f}..{row['tokens_per_s_max']:.0f}"
        print(
            f"{row['path']:<22}{row['max_tokens']:>8}{row['concurrency']:>6}{row['tokens_per_s']:>9.0f}{spread:>15}"
            f"{_fmt(row['ratio'], '.2f'):>7}{_fmt(row.get('paired_ratio'), '.2f'):>7}{row['requests_per_s']:>8.1f}"
            f"{_fmt(row['ttft_p50_ms'], '.1f'):>8}"
            f"{_fmt(row['ttft_p99_ms'], '.1f'):>8}{_fmt(row['e2e_p50_ms'], '.0f'):>8}"
            f"{_fmt(row['e2e_p99_ms'], '.0f'):>8}"
            f"{_fmt(row['cpu_s_per_1k_tokens'], '.2f'):>8}{_fmt(row['client_cores'], '.2f'):>7}"
        )
    print(
        "ratio: the median tok/s over the median of bare (plain paths) or bare-stream (streamed paths); paired: the"
        " median of the ratios of the repetitions in which both were measured (seconds apart with --interleave);"
        " client: cores the client used"
    )
    # A core with several front ends counts its steps untimed (core/step_stats.py): "-" for the rates.
    engine_rows = [
        row for row in rows if row.get("engine_running_mean") is not None or row.get("engine_intake_ms") is not None
    ]
    if engine_rows:
        print("\nthe engine's steps over each level (--profile; median of the repetitions):")
        print(
            f"{'path':<22}{'max_tok':>8}{'conc':>6}{'running':>9}{'steps/s':>9}{'ratio':>7}"
            f"{'prefill':>9}{'decode/s':>9}{'ratio':>7}{'wait ms':>9}{'cpu ms':>8}{'intake':>8}{'handed':>8}"
            f"{'return':>8}{'queue':>7}{'1st tok':>8}{'ms/tok':>8}{'step ms':>8}{'prompt':>7}{'cached':>7}"
        )
        by_key = {(row["path"], row["max_tokens"], row["concurrency"]): row for row in engine_rows}
        for row in engine_rows:
            base = by_key.get((row["baseline"], row["max_tokens"], row["concurrency"]), {})
            ratio = _ratio(row.get("engine_steps_per_s"), base.get("engine_steps_per_s"))
            decode_ratio = _ratio(row.get("engine_decode_steps_per_s"), base.get("engine_decode_steps_per_s"))
            decode_rate, wait = row.get("engine_decode_steps_per_s"), row.get("engine_decode_wait_ms")
            cpu = 1000 / decode_rate - wait if decode_rate and wait is not None else None
            print(
                f"{row['path']:<22}{row['max_tokens']:>8}{row['concurrency']:>6}"
                f"{_fmt(row.get('engine_running_mean'), '.1f'):>9}{_fmt(row.get('engine_steps_per_s'), '.1f'):>9}"
                f"{_fmt(ratio, '.2f'):>7}"
                f"{_fmt(row.get('engine_prefill_share'), '.2f'):>9}{_fmt(decode_rate, '.1f'):>9}"
                f"{_fmt(decode_ratio, '.2f'):>7}{_fmt(wait, '.2f'):>9}{_fmt(cpu, '.2f'):>8}"
                f"{_fmt(row.get('engine_intake_ms'), '.1f'):>8}{_fmt(row.get('engine_handover_ms'), '.1f'):>8}"
                f"{_fmt(row.get('engine_return_ms'), '.1f'):>8}"
                f"{_fmt(row.get('engine_queue_ms'), '.1f'):>7}{_fmt(row.get('engine_prefill_ms'), '.1f'):>8}"
                f"{_fmt(row.get('engine_token_ms'), '.2f'):>8}{_fmt(row.get('engine_step_ms'), '.2f'):>8}"
                f"{_fmt(row.get('engine_prompt_computed'), '.0f'):>7}"
                f"{_fmt(row.get('engine_cache_hit_share'), '.2f'):>7}"
            )
        print(
            "running: requests in the engine's batch per step; ratio: steps/s to the baseline's; prefill: the share of"
            " steps that computed prompt tokens; decode/s: decode-only steps per second (ratio to the baseline's);"
            " wait ms: the EngineCore's wait for the model's result per decode step; cpu ms: the rest of a decode step;"
            " intake: ms from handing a request to vLLM (the core's execute, the bare client's call) until the"
            " EngineCore queued it; handed: of it, ms until vLLM's front end began taking the request's inputs in;"
            " return: ms from the end of the step that made an output until its consumer had it;"
            " inside the EngineCore, per finished request: queue: ms from queued to first scheduled, 1st tok: from"
            " then until the step that made its first token ended, ms/tok: per token after the first (means, by the"
            " EngineCore's clock); step ms: the repetition's wall time over the engine's steps in it (for a core with"
            " several front ends too: the same work in more ms is slower steps; a core's counts scaled to the level's"
            " own tokens, LevelResult.engine_share); prompt: prompt tokens the model computed per request; cached: the"
            " share of the prompt tokens looked up that the prefix cache held"
        )
    triton_rows = [row for row in rows if row.get("triton_models")]
    if triton_rows:
        print("\nTriton's statistics per request of each model (--profile; median of the repetitions):")
        print(f"{'path':<22}{'max_tok':>8}{'conc':>6}  {'model':<24}{'queue ms':>9}{'execute ms':>11}{'per exec':>9}")
        for row in triton_rows:
            for model, x in row["triton_models"].items():
                print(
                    f"{row['path']:<22}{row['max_tokens']:>8}{row['concurrency']:>6}  {model:<24}"
                    f"{x['queue_ms']:>9.2f}{x['execute_ms']:>11.2f}{x['per_execute']:>9.2f}"
                )
        print(
            "queue ms: a request's mean wait in Triton's queue for an instance of the model; execute ms: its mean time"
            " in the model's execute (for a decoupled model or one answering from threads, until execute returned, not"
            " until the answer); per exec: requests per execute (1: one at a time)"
        )


# The performance issue's rule: each target is judged by the median of 3 paired repetitions of one run; a ratio
# from fewer is printed, not judged, unless two of them already decide that median (_paired_verdict).
TARGET_REPETITIONS = 3

# The performance issue's targets: (our path, the path it is held against, the minimum ratio, the levels).
TARGETS = (
    ("plain-grpc", "bare", 0.95, (64, 256)),
    ("stream-grpc", "bare-stream", 0.90, (64, 256)),
    ("plain-grpc", "vllm-serve", 1.0, None),
    ("stream-grpc", "vllm-serve-stream", 1.0, None),
    ("stream-grpc", "vllm-backend-stream", 1.3, (64, 256)),
    ("stream-grpc", "vllm-backend-stream", 1.0, (1, 16)),
)


def noise_lines(results: list[LevelResult]) -> list[str]:
    """How far this machine lets a paired ratio be trusted: `bare` and `bare-stream` are one engine measured seconds
    apart (they differ only in vLLM's output kind, ~2 % at one stream), so their ratio per round is the machine's own
    spread for each level."""
    lines = []
    for (max_tokens, concurrency), paths in sorted(tokens_per_round(results).items()):
        bare, stream = paths.get("bare", {}), paths.get("bare-stream", {})
        ratios = [stream[k] / bare[k] for k in sorted(set(bare) & set(stream)) if bare[k] > 0]
        if ratios:
            lines.append(
                f"one engine, bare-stream / bare at {max_tokens} tokens x {concurrency}, per round: "
                + " / ".join(f"{x:.2f}" for x in ratios)
            )
    return lines


def load_lines(results: list[LevelResult]) -> list[str]:
    """--background-load-alternate: each path's tok/s in a loaded repetition over the unloaded one just before it
    (repetitions 2k+1 and 2k of one command), per level: how much the busy CPUs slowed that path."""
    by_round = {(r.round_id, r.path, r.max_tokens, r.concurrency): r for r in results}
    ratios: dict[tuple[int, int, str], list[float]] = {}
    for r in results:
        command, _, rep = r.round_id.partition(".")
        before = by_round.get((f"{command}.{int(rep) - 1}", r.path, r.max_tokens, r.concurrency)) if rep else None
        if r.background_load and before is not None and not before.background_load and int(rep) % 2 == 1:
            key = (r.max_tokens, r.concurrency, r.path)
            ratios.setdefault(key, []).append(r.tokens_per_second / before.tokens_per_second)
    return [
        f"{path} at {max_tokens} tokens x {concurrency}, loaded / unloaded per pair: "
        + " / ".join(f"{x:.2f}" for x in values)
        + f" (median {statistics.median(values):.2f})"
        for (max_tokens, concurrency, path), values in sorted(ratios.items())
    ]


def target_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Each target of the performance issue that this run can judge: the ratio per level and whether it holds."""
    by_key = {(r["path"], r["max_tokens"], r["concurrency"]): r for r in rows}
    lines = []
    for ours, other, minimum, levels in TARGETS:
        for (path, max_tokens, concurrency), row in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if path != ours or (levels is not None and concurrency not in levels):
                continue
            against = by_key.get((other, max_tokens, concurrency))
            if against is None:
                continue
            # Paired repetitions where there are any: the machine's drift between them is smaller.
            series = row.get("paired_series", {}).get(other)
            if series:
                ratio = statistics.median(series)
                how = "paired (" + " ".join(f"{x:.2f}" for x in series) + "; "
                verdict = _paired_verdict(series, minimum)
            else:
                ratio, repetitions = row["tokens_per_s"] / against["tokens_per_s"], min(row["reps"], against["reps"])
                how = "of medians ("
                verdict = _verdict(ratio >= minimum, repetitions)
            lines.append(
                f"{ours} / {other} at {max_tokens} tokens x {concurrency}: {ratio:.2f} {how}target >= {minimum})"
                f" {verdict}"
            )
    for max_tokens, concurrency in [(m, c) for (p, m, c) in by_key if p == "stream-grpc"]:
        ours, base = (
            by_key[("stream-grpc", max_tokens, concurrency)],
            by_key.get(("bare-stream", max_tokens, concurrency)),
        )
        if base is None or ours["ttft_p50_ms"] is None or base["ttft_p50_ms"] is None or concurrency not in (1, 256):
            continue
        repetitions = min(ours["reps"], base["reps"])  # each p50 is over all of a path's repetitions' first tokens
        if concurrency == 1:
            added = ours["ttft_p50_ms"] - base["ttft_p50_ms"]
            lines.append(
                f"TTFT p50 at {max_tokens} tokens x 1: +{added:.1f} ms over bare-stream (target <= 5)"
                f" {_verdict(added <= 5, repetitions)}"
            )
        else:
            ratio = ours["ttft_p50_ms"] / base["ttft_p50_ms"]
            lines.append(
                f"TTFT p50 at {max_tokens} tokens x 256: {ratio:.2f}x bare-stream (target <= 1.5)"
                f" {_verdict(ratio <= 1.5, repetitions)}"
            )
    return lines


def _verdict(holds: bool, repetitions: int) -> str:
    if repetitions < TARGET_REPETITIONS:
        return f"not judged ({repetitions} of {TARGET_REPETITIONS} repetitions)"
    return "met" if holds else "NOT met"


def _paired_verdict(series: list[float], minimum: float) -> str:
    """A paired target from its repetitions' ratios. With fewer than 3, the median of 3 is already decided when a
    majority of 3 lies on one side of the target (two of two below it: no third can lift the median): a run need not
    spend device time on a repetition that cannot change its verdict."""
    if len(series) < TARGET_REPETITIONS:
        majority = TARGET_REPETITIONS // 2 + 1
        meeting = sum(x >= minimum for x in series)
        below = len(series) - meeting
        if meeting >= majority:
            return f"met (decided: {meeting} of the {TARGET_REPETITIONS} repetitions meet it)"
        if below >= majority:
            return f"NOT met (decided: {below} of the {TARGET_REPETITIONS} repetitions are below it)"
    return _verdict(statistics.median(series) >= minimum, len(series))


def plot(rows: list[dict[str, Any]], target: Path) -> None:
    if not rows:  # a run that measured nothing: no plot (and an earlier one stays)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    max_tokens = sorted({r["max_tokens"] for r in rows})
    fig, axes = plt.subplots(len(max_tokens), 2, figsize=(12, 4.5 * len(max_tokens)), squeeze=False)
    for i, mt in enumerate(max_tokens):
        for path in sorted({r["path"] for r in rows}):
            mine = sorted(
                (r for r in rows if r["path"] == path and r["max_tokens"] == mt), key=lambda r: r["concurrency"]
            )
            xs = [r["concurrency"] for r in mine]
            axes[i][0].errorbar(
                xs,
                [r["tokens_per_s"] for r in mine],
                yerr=[
                    [r["tokens_per_s"] - r["tokens_per_s_min"] for r in mine],
                    [r["tokens_per_s_max"] - r["tokens_per_s"] for r in mine],
                ],
                marker="o",
                capsize=3,
                label=path,
            )
            ttft = [(r["concurrency"], r["ttft_p50_ms"]) for r in mine if r["ttft_p50_ms"] is not None]
            if ttft:
                axes[i][1].plot(*zip(*ttft, strict=True), marker="o", label=path)
        axes[i][0].set(
            xscale="log", xlabel="concurrency", ylabel="output tokens/s", title=f"throughput, max_tokens={mt}"
        )
        axes[i][1].set(
            xscale="log", yscale="log", xlabel="concurrency", ylabel="TTFT p50 (ms)", title=f"TTFT, max_tokens={mt}"
        )
        for ax in axes[i]:
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # no TTFT lines when no streamed path ran
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
