"""Where one request's time goes inside the server: Triton's own trace timestamps, per ensemble step.

    .venv/bin/python tools/trace_timeline.py [--deployment FILE] [--requests 20] [--max-tokens 64] [--out DIR]

Renders the deployment (as tools/bench.py does), starts tritonserver with tracing off, warms up, then turns
Triton's TIMESTAMPS tracing on (its /v2/trace/setting API) and sends requests one at a time: streamed ones to the
streaming ensemble, then 1-token plain ones to the plain ensemble. Prints the client's time to first token (and the
plain requests' latency), then, per ensemble, every step's timestamps as the median over the requests in ms after
the ensemble's REQUEST_START: when each model got the request, waited in its queue, computed, and (for the
postprocess of the first delta) when the core's first response reached tritonserver. Only the first execution of
each model per request is shown (a streamed request runs postprocess once per delta). The core's own counters
(core/core_stats.py: for each first response, the time from the core's `execute` to vLLM's first output, then in
its sender queue, then the send) are on for this server, and their log lines for each phase are printed too. They
turn vLLM's per-step statistics on (core/step_stats.py), so the engine runs as under `tools/bench.py --profile`.

`--concurrency N` (N > 1) traces a loaded level instead: N streams of closed-loop requests (as a bench level, from
`--client-processes` processes), every request traced, per ensemble. It prints each event's offset as mean, p50
and p90, and the mean time from the event before it: by Little's law each mean gap times the request rate is the
number of requests in that segment at any moment, so the gaps show where the requests that are not in the engine
are. The client's share (gRPC both ways, the client's own turnaround) is its cycle time per request minus the
ensemble's REQUEST_START-to-REQUEST_END.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.core_stats import ENVIRONMENT_KEY as CORE_STATS_KEY  # noqa: E402
from tools.bench import CORE_STATS_MARK, BenchSetup, bench_repository, build_prompts, core_stats_line  # noqa: E402
from tools.bench_clients import ClientSpec, open_client, open_runner, run_level  # noqa: E402
from tools.bench_results import percentile  # noqa: E402
from tools.triton_server import TritonServer, start_on_free_ports  # noqa: E402

TRACE_OFF = ["--trace-config=level=OFF", "--trace-config=rate=1", "--trace-config=count=-1"]
CORE_STATS_SECONDS = 1.0


def load_trace(path: Path) -> dict[int, dict[str, Any]]:
    """Triton's trace file (a JSON array of records, possibly unterminated) -> id -> model, parent, timestamps."""
    text = path.read_text().strip()
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        records = json.loads(text.rstrip(",") + "]")
    traces: dict[int, dict[str, Any]] = {}
    for record in records:
        trace = traces.setdefault(record["id"], {"model": None, "parent": None, "timestamps": []})
        trace["model"] = record.get("model_name", trace["model"])
        trace["parent"] = record.get("parent_id", trace["parent"])
        trace["timestamps"] += [(t["name"], t["ns"]) for t in record.get("timestamps", [])]
    return traces


def timeline(traces: dict[int, dict[str, Any]], ensemble: str) -> tuple[int, dict[str, float]]:
    """Median ms after the ensemble's REQUEST_START of each "<model> <event>" (first execution of each model)."""
    count, offsets = event_offsets(traces, ensemble)
    medians = {key: statistics.median(values) for key, values in offsets.items()}
    return count, dict(sorted(medians.items(), key=lambda item: item[1]))


def event_offsets(traces: dict[int, dict[str, Any]], ensemble: str) -> tuple[int, dict[str, list[float]]]:
    """Per "<model> <event>", its ms after the ensemble's REQUEST_START in each traced request (the first execution
    of each model, and the ensemble's own events), and how many requests were traced."""
    children: dict[int, list[int]] = defaultdict(list)
    for trace_id, trace in traces.items():
        if trace["parent"] is not None:
            children[trace["parent"]].append(trace_id)
    offsets: dict[str, list[float]] = defaultdict(list)
    count = 0
    for trace_id, trace in traces.items():
        starts = [ns for name, ns in trace["timestamps"] if name == "REQUEST_START"]
        if trace["model"] != ensemble or not starts:
            continue
        count += 1
        origin = min(starts)
        events: dict[str, int] = {}
        for name, ns in trace["timestamps"]:
            events.setdefault(f"{ensemble} {name}", ns)
        family, stack = [], list(children[trace_id])
        while stack:
            child = stack.pop()
            family.append(child)
            stack.extend(children[child])
        family.sort(key=lambda child: min((ns for _, ns in traces[child]["timestamps"]), default=0))
        seen: set[str] = set()
        for child in family:
            model = traces[child]["model"]
            if model in seen:
                continue
            seen.add(model)
            for name, ns in traces[child]["timestamps"]:
                events.setdefault(f"{model} {name}", ns)
        for key, ns in events.items():
            offsets[key].append((ns - origin) / 1e6)
    return count, offsets


def loaded_level_table(offsets: dict[str, list[float]]) -> list[tuple[str, float, float, float, float]]:
    """(event, mean, p50, p90, mean gap from the event before it), in the order of the mean offsets."""
    rows, previous = [], 0.0
    for key, values in sorted(offsets.items(), key=lambda item: statistics.fmean(item[1])):
        mean = statistics.fmean(values)
        rows.append((key, mean, percentile(values, 50), percentile(values, 90), mean - previous))
        previous = mean
    return rows


def start_traced_server(args: argparse.Namespace) -> tuple[BenchSetup, TritonServer, Path]:
    """The deployment rendered as the bench does, and tritonserver started with tracing off (turned on per phase)
    and the core's counters on: the set-up, the server and its trace file."""
    args.out.mkdir(parents=True, exist_ok=True)
    setup = bench_repository(args.out, args.deployment, {})
    trace_file = args.out / "trace.json"
    trace_file.unlink(missing_ok=True)
    server = start_on_free_ports(
        setup.repo,
        args.out / "triton.log",
        extra_args=[f"--trace-config=triton,file={trace_file}", *TRACE_OFF],
        environment={CORE_STATS_KEY: str(CORE_STATS_SECONDS)},
    )
    return setup, server, trace_file


async def measure(args: argparse.Namespace) -> None:
    setup, server, trace_file = start_traced_server(args)
    prompts = build_prompts(setup.tokenizer)
    core_lines: dict[str, list[str]] = {}

    def core_stats_since(offset: int) -> tuple[list[str], int]:
        time.sleep(CORE_STATS_SECONDS + 0.5)  # the core logs each interval's counters at its end
        text = server.log_text()
        lines = text[offset:].splitlines()
        found = [core_stats_line(line) for line in lines if CORE_STATS_MARK in line]
        return found, len(text)

    try:
        stream, close_stream = await open_client(ClientSpec("grpc-stream", server.grpc_url, setup.streaming))
        plain, close_plain = await open_client(ClientSpec("grpc-infer", server.grpc_url, setup.plain))
        await run_level(stream, prompts, 16, 64, args.max_tokens)  # warm-up, untraced
        await run_level(plain, prompts, 16, 64, 1)
        server.trace_setting(trace_level=["TIMESTAMPS"], trace_rate="1")
        _, offset = core_stats_since(0)
        ttfts, latencies = [], []
        for i in range(args.requests):
            ttfts.append((await stream(prompts[i % len(prompts)], args.max_tokens)).ttft * 1000)
        core_lines[setup.streaming], offset = core_stats_since(offset)
        for i in range(args.requests):
            latencies.append((await plain(prompts[i % len(prompts)], 1)).latency * 1000)
        core_lines[setup.plain], offset = core_stats_since(offset)
        server.trace_setting(trace_level=["OFF"])
        await close_stream()
        await close_plain()
    finally:
        server.stop()
    print(f"client: streamed TTFT p50 {statistics.median(ttfts):.2f} ms (min {min(ttfts):.2f})")
    print(f"client: plain 1-token latency p50 {statistics.median(latencies):.2f} ms (min {min(latencies):.2f})")
    traces = load_trace(trace_file)
    for ensemble in (setup.streaming, setup.plain):
        count, medians = timeline(traces, ensemble)
        print(f"\n{ensemble}: {count} requests traced; median ms after the ensemble's REQUEST_START")
        for key, ms in medians.items():
            print(f"  {ms:8.2f}  {key}")
        print(f"the core's counters while {ensemble} was traced (one line per {CORE_STATS_SECONDS:g} s):")
        for line in core_lines.get(ensemble, []):
            print(f"  {line}")


async def measure_loaded(args: argparse.Namespace) -> None:
    """Every request of a loaded level traced (see the module's docstring)."""
    setup, server, trace_file = start_traced_server(args)
    prompts = build_prompts(setup.tokenizer)
    cycles: dict[str, float] = {}
    try:
        for ensemble, kind in ((setup.plain, "grpc-infer"), (setup.streaming, "grpc-stream")):
            runner = await open_runner(ClientSpec(kind, server.grpc_url, ensemble), args.client_processes)
            try:
                await runner.prepare(prompts, args.concurrency, args.requests, args.max_tokens)  # warm-up, untraced
                server.trace_setting(trace_level=["TIMESTAMPS"], trace_rate="1")
                run = await runner.run()
                server.trace_setting(trace_level=["OFF"])
            finally:
                await runner.close()
            # Mean time between a stream's request starts: the whole cycle one request takes.
            cycles[ensemble] = run.wall * args.concurrency / len(run.samples) * 1000
            latency = statistics.fmean(sample.latency for sample in run.samples) * 1000
            tokens = sum(sample.output_tokens for sample in run.samples)
            print(
                f"{ensemble}: {len(run.samples)} requests, {args.concurrency} streams, {tokens / run.wall:.0f} tok/s;"
                f" per request: cycle {cycles[ensemble]:.1f} ms, client latency mean {latency:.1f} ms"
            )
    finally:
        server.stop()
    traces = load_trace(trace_file)
    for ensemble in cycles:
        count, offsets = event_offsets(traces, ensemble)
        print(f"\n{ensemble}: {count} requests traced; ms after the ensemble's REQUEST_START")
        print(f"  {'mean':>8} {'p50':>8} {'p90':>8} {'gap':>8}  event")
        for key, mean, p50, p90, gap in loaded_level_table(offsets):
            print(f"  {mean:8.2f} {p50:8.2f} {p90:8.2f} {gap:8.2f}  {key}")
        inside = statistics.fmean(offsets.get(f"{ensemble} REQUEST_END", [0.0]))
        outside = cycles[ensemble] - inside
        print(f"  outside the server (client, gRPC): {outside:.1f} ms of a {cycles[ensemble]:.1f} ms cycle")
    print("\nthe core's counters (one line per second):")
    for line in server.log_text().splitlines():
        if CORE_STATS_MARK in line:
            print(f"  {core_stats_line(line)}")
        elif "vllm_core engine steps" in line:
            print(f"  {line[line.index('vllm_core') :].rstrip().rstrip(chr(34))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", type=Path, help="the deployment file (default: the CPU bench set-up)")
    parser.add_argument("--requests", type=int, default=20, help="traced requests per ensemble, one at a time")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of the streamed requests")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "trace")
    parser.add_argument("--concurrency", type=int, default=1, help="above 1: trace a loaded level of this many streams")
    parser.add_argument("--client-processes", type=int, default=1, help="client processes of a loaded level")
    args = parser.parse_args(argv)
    asyncio.run(measure_loaded(args) if args.concurrency > 1 else measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
