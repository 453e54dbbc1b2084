"""Side-by-side benchmark: bare vLLM, `vllm serve`, and our ensembles, in one run, same model and engine args.

    .venv/bin/python tools/bench.py [--levels 1,16,64,256] [--max-tokens 64,256] [--reps 3]
                                    [--paths bare,vllm-serve,plain-grpc,plain-http,stream-grpc]
                                    [--extra-model NAME ...] [--quick] [--out .bench]

Paths:
  bare          vLLM AsyncLLM in one process (a worker subprocess of this script), FINAL_ONLY outputs: the limit
  bare-stream   the same with DELTA outputs (gives TTFT)
  vllm-serve    vLLM's OpenAI server (python -m vllm.entrypoints.openai.api_server), /v1/completions, aiohttp
  vllm-serve-stream   the same, streamed (gives TTFT)
  plain-grpc    our plain-infer ensemble, gRPC ModelInfer (tritonclient.grpc.aio)
  plain-http    our plain-infer ensemble, HTTP /generate (aiohttp)
  stream-grpc   our streaming ensemble, gRPC bidirectional stream (gives TTFT)
  --extra-model NAME   another model in the same Triton server with the vLLM backend's interface (gRPC infer)

Workload: fixed prompts (half short, half ~400 tokens), temperature 0, ignore_eos, each max_tokens, each
concurrency level with a bounded number of requests; one warm-up round per path and level is not counted.
Reports per path and level: output tokens/s, requests/s, TTFT p50/p99, end-to-end latency p50/p99, server-side
CPU seconds per 1k output tokens (all processes of the server's process group), the ratio to `bare`, and the
spread (min..max) over the repetitions. Results go to OUT/results.json and OUT/bench.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL  # noqa: E402
from tools.build_tiny_model import build as build_tiny_model  # noqa: E402
from tools.triton_server import (  # noqa: E402
    TritonServer,
    free_port,
    process_table,
    server_environment,
    start_on_free_ports,
)

# Engine args shared by every path: the default deployment's, with room for 400-token prompts + 256 new
# tokens at concurrency 256.
BENCH_ENGINE_OVERRIDES = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 256}


@dataclass
class Sample:
    latency: float
    ttft: float | None
    output_tokens: int


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

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.wall


# Workload ------------------------------------------------------------------------------------------------


def build_prompts(tokenizer_dir: Path, count: int = 16) -> list[list[int]]:
    """Half short prompts, half ~400-token prompts, from the shipped corpus (fixed, deterministic)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer.encode((ROOT / "tools" / "corpus" / "tiny_corpus.txt").read_text(encoding="utf-8"))
    prompts = []
    for i in range(count):
        start = (i * 97) % (len(ids) - 420)
        length = 8 + (i * 5) % 16 if i % 2 == 0 else 400
        prompts.append(ids[start : start + length])
    return prompts


def requests_for(concurrency: int, quick: bool) -> int:
    return max(8, min(512, 4 * concurrency)) // (4 if quick else 1)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def process_group_cpu(pgid: int) -> float:
    return sum(p.cpu_seconds for p in process_table().values() if p.pgid == pgid)


async def run_level(send, prompts: list[list[int]], concurrency: int, total: int, max_tokens: int, progress):
    """Run `total` requests with at most `concurrency` in flight; send(prompt_ids, max_tokens) -> Sample."""
    gate = asyncio.Semaphore(concurrency)
    samples: list[Sample] = []

    async def one(i: int) -> None:
        async with gate:
            samples.append(await send(prompts[i % len(prompts)], max_tokens))
            if progress is not None:
                progress.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total)))
    return samples, time.perf_counter() - start


# Clients -------------------------------------------------------------------------------------------------


class TritonPaths:
    def __init__(self, server: TritonServer, plain: str, streaming: str) -> None:
        self.server, self.plain, self.streaming = server, plain, streaming
        self._grpc = None
        self._http = None

    async def open(self) -> None:
        import aiohttp
        import tritonclient.grpc.aio as grpc_aio

        self._grpc = grpc_aio.InferenceServerClient(self.server.grpc_url)
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        await self._grpc.close()
        await self._http.close()

    @staticmethod
    def _inputs(module: Any, text: str, max_tokens: int, stream: bool) -> list[Any]:
        import numpy as np

        sampling = json.dumps({"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True})
        arrays = [
            ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
            ("sampling_parameters", np.array([sampling.encode()], dtype=np.object_), "BYTES"),
            ("stream", np.array([stream]), "BOOL"),
            ("exclude_input_in_output", np.array([True]), "BOOL"),
        ]
        inputs = []
        for name, array, dtype in arrays:
            tensor = module.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        return inputs

    def grpc_infer(self, model: str, tokenizer: Any):
        import tritonclient.grpc.aio as grpc_aio

        async def send(prompt: list[int], max_tokens: int) -> Sample:
            start = time.perf_counter()
            await self._grpc.infer(model, self._inputs(grpc_aio, tokenizer.decode(prompt), max_tokens, False))
            return Sample(time.perf_counter() - start, None, max_tokens)

        return send

    def http_generate(self, tokenizer: Any):
        async def send(prompt: list[int], max_tokens: int) -> Sample:
            payload = {
                "text_input": tokenizer.decode(prompt),
                "exclude_input_in_output": True,
                "parameters": {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True},
            }
            start = time.perf_counter()
            async with self._http.post(
                f"http://{self.server.http_url}/v2/models/{self.plain}/generate", json=payload
            ) as r:
                body = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
            return Sample(time.perf_counter() - start, None, max_tokens)

        return send

    def grpc_stream(self, tokenizer: Any):
        import tritonclient.grpc.aio as grpc_aio

        async def send(prompt: list[int], max_tokens: int) -> Sample:
            inputs = self._inputs(grpc_aio, tokenizer.decode(prompt), max_tokens, True)

            async def requests():
                yield {"model_name": self.streaming, "inputs": inputs, "request_id": "b"}

            start = time.perf_counter()
            ttft = None
            async for result, error in self._grpc.stream_infer(requests()):
                if error is not None:
                    raise error
                if ttft is None:
                    ttft = time.perf_counter() - start
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            return Sample(time.perf_counter() - start, ttft, max_tokens)

        return send


class VllmServe:
    def __init__(self, engine_args: dict[str, Any], log: Path) -> None:
        self.port = free_port()
        self.engine_args = engine_args
        self.log = log
        self.process: subprocess.Popen | None = None
        self._http = None
        self._log_handle = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--served-model-name", "bench"]
        for key, value in self.engine_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif value is not False:
                cmd += [flag, str(value)]
        return cmd

    async def start(self) -> None:
        import aiohttp

        self._log_handle = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.command(),
            env=server_environment(),
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.process.returncode}); see {self.log}")
            try:
                async with self._http.get(f"http://127.0.0.1:{self.port}/health") as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.5)
        raise TimeoutError(f"vllm serve not ready; see {self.log}")

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._log_handle is not None:
            self._log_handle.close()

    def client(self, stream: bool):
        url = f"http://127.0.0.1:{self.port}/v1/completions"

        async def send(prompt: list[int], max_tokens: int) -> Sample:
            payload = {
                "model": "bench",
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": stream,
            }
            start = time.perf_counter()
            ttft = None
            async with self._http.post(url, json=payload) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
                if stream:
                    async for line in r.content:
                        if ttft is None and line.startswith(b"data: ") and b'"text"' in line:
                            ttft = time.perf_counter() - start
                else:
                    await r.read()
            return Sample(time.perf_counter() - start, ttft, max_tokens)

        return send


# The bare engine, in a worker subprocess (its own process group, so its CPU is counted like a server's) ---


async def bare_worker(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from core.engine import prepare_process_environment

    prepare_process_environment()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**spec["engine_args"]))
    kind = RequestOutputKind.DELTA if spec["stream"] else RequestOutputKind.FINAL_ONLY
    counter = iter(range(10**9))

    async def send(prompt: list[int], max_tokens: int) -> Sample:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind)
        start = time.perf_counter()
        ttft = None
        async for _ in llm.generate({"prompt_token_ids": prompt}, params, f"bare-{next(counter)}"):
            if ttft is None:
                ttft = time.perf_counter() - start
        return Sample(time.perf_counter() - start, ttft if spec["stream"] else None, max_tokens)

    results = []
    try:
        for level in spec["levels"]:
            results.append(await measure(send, spec["prompts"], level, os.getpgid(0), None))
    finally:
        llm.shutdown()
    return results


async def measure(send, prompts, level: dict[str, Any], pgid: int | None, progress) -> dict[str, Any]:
    await run_level(send, prompts, level["concurrency"], min(level["concurrency"], 16), level["max_tokens"], None)
    cpu_before = process_group_cpu(pgid) if pgid else None
    samples, wall = await run_level(
        send, prompts, level["concurrency"], level["requests"], level["max_tokens"], progress
    )
    cpu = process_group_cpu(pgid) - cpu_before if pgid else None
    return {
        "wall": wall,
        "output_tokens": sum(s.output_tokens for s in samples),
        "cpu_seconds": cpu,
        "latencies": [s.latency for s in samples],
        "ttfts": [s.ttft for s in samples if s.ttft is not None],
    }


def run_bare(engine_args: dict[str, Any], prompts, levels, stream: bool, log: Path) -> list[dict[str, Any]]:
    spec = {"engine_args": engine_args, "prompts": prompts, "levels": levels, "stream": stream}
    spec_file = log.with_suffix(".json")
    spec_file.write_text(json.dumps(spec))
    out = log.with_suffix(".out.json")
    with open(log, "wb") as log_handle:
        code = subprocess.call(
            [sys.executable, __file__, "--bare-worker", str(spec_file), str(out)],
            env=server_environment(),
            stdout=log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    if code != 0:
        raise RuntimeError(f"bare worker failed ({code}); see {log}")
    return json.loads(out.read_text())


# The run -------------------------------------------------------------------------------------------------


def bench_repository(out: Path) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """Render the default deployment with the benchmark's engine args into OUT/repo; (repo, engine args, engine
    environment): the bare and `vllm serve` paths run with the same engine args AND the same engine_env."""
    from tools.render_repo import DEFAULT_CONFIG, load_deployment, render, write

    deployment = load_deployment(DEFAULT_CONFIG)
    deployment.engine_args = {**deployment.engine_args, **BENCH_ENGINE_OVERRIDES}
    repo = out / "repo"
    write(render(deployment, repo), repo)
    from core.engine_config import load_engine_args

    return repo, load_engine_args(repo / deployment.names.core / "1" / "model.json"), dict(deployment.engine_env)


def summarize(results: list[LevelResult]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(r.path, r.max_tokens, r.concurrency) for r in results}, key=lambda k: (k[1], k[0], k[2]))
    bare = {(r.max_tokens, r.concurrency): [] for r in results if r.path == "bare"}
    for r in results:
        if r.path == "bare":
            bare[(r.max_tokens, r.concurrency)].append(r.tokens_per_second)
    for path, max_tokens, concurrency in keys:
        reps = [r for r in results if (r.path, r.max_tokens, r.concurrency) == (path, max_tokens, concurrency)]
        tps = [r.tokens_per_second for r in reps]
        latencies = [x for r in reps for x in r.latencies]
        ttfts = [x for r in reps for x in r.ttfts]
        cpu = [r.cpu_seconds / r.output_tokens * 1000 for r in reps if r.cpu_seconds is not None]
        base = bare.get((max_tokens, concurrency))
        rows.append(
            {
                "path": path,
                "max_tokens": max_tokens,
                "concurrency": concurrency,
                "tokens_per_s": statistics.median(tps),
                "tokens_per_s_min": min(tps),
                "tokens_per_s_max": max(tps),
                "requests_per_s": statistics.median(r.requests / r.wall for r in reps),
                "ratio_to_bare": statistics.median(tps) / statistics.median(base) if base else None,
                "ttft_p50_ms": _ms(percentile(ttfts, 50)),
                "ttft_p99_ms": _ms(percentile(ttfts, 99)),
                "e2e_p50_ms": _ms(percentile(latencies, 50)),
                "e2e_p99_ms": _ms(percentile(latencies, 99)),
                "cpu_s_per_1k_tokens": statistics.median(cpu) if cpu else None,
            }
        )
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'path':<18}{'max_tok':>8}{'conc':>6}{'tok/s':>9}{'spread':>15}{'ratio':>7}{'req/s':>8}"
        f"{'ttft50':>8}{'ttft99':>8}{'e2e50':>8}{'e2e99':>8}{'cpu/1k':>8}"
    )
    print(header)
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for row in rows:
        spread = f"{row['tokens_per_s_min']:.0f}..{row['tokens_per_s_max']:.0f}"
        print(
            f"{row['path']:<18}{row['max_tokens']:>8}{row['concurrency']:>6}{row['tokens_per_s']:>9.0f}{spread:>15}"
            f"{fmt(row['ratio_to_bare'], '.2f'):>7}{row['requests_per_s']:>8.1f}{fmt(row['ttft_p50_ms'], '.1f'):>8}"
            f"{fmt(row['ttft_p99_ms'], '.1f'):>8}{fmt(row['e2e_p50_ms'], '.0f'):>8}{fmt(row['e2e_p99_ms'], '.0f'):>8}"
            f"{fmt(row['cpu_s_per_1k_tokens'], '.2f'):>8}"
        )


def plot(rows: list[dict[str, Any]], target: Path) -> None:
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
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=110)


async def run_all(args: argparse.Namespace) -> list[LevelResult]:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_model(TINY_MODEL)
    repo, engine_args, engine_env = bench_repository(out)
    os.environ.update(engine_env)  # server_environment() copies it into every engine process of every path
    prompts = build_prompts(TINY_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(TINY_MODEL)
    levels = [
        {"concurrency": c, "max_tokens": m, "requests": requests_for(c, args.quick)}
        for m in args.max_tokens
        for c in args.levels
    ]
    paths = list(args.paths) + [f"extra:{name}" for name in args.extra_model]
    total = sum(level["requests"] for level in levels) * args.reps * len(paths)
    progress = tqdm(total=total, unit="req", desc="bench", file=sys.stderr)
    results: list[LevelResult] = []

    def record(path: str, rep: int, level: dict[str, Any], measured: dict[str, Any]) -> None:
        results.append(LevelResult(path, level["max_tokens"], level["concurrency"], rep, level["requests"], **measured))

    for rep in range(args.reps):
        for path in [p for p in paths if p.startswith("bare")]:
            progress.set_description(f"{path} (rep {rep + 1})")
            measured = run_bare(engine_args, prompts, levels, path == "bare-stream", out / f"{path}-{rep}.log")
            for level, m in zip(levels, measured, strict=True):
                record(path, rep, level, m)
                progress.update(level["requests"])

        for path in [p for p in paths if p.startswith("vllm-serve")]:
            progress.set_description(f"{path} (rep {rep + 1})")
            serve = VllmServe(engine_args, out / f"{path}-{rep}.log")
            await serve.start()
            try:
                for level in levels:
                    record(
                        path,
                        rep,
                        level,
                        await measure(
                            serve.client(path.endswith("stream")), prompts, level, serve.process.pid, progress
                        ),
                    )
            finally:
                await serve.stop()

        triton_paths = [p for p in paths if not p.startswith(("bare", "vllm-serve"))]
        if triton_paths:
            server = start_on_free_ports(repo, out / f"triton-{rep}.log")
            try:
                client = TritonPaths(server, "vllm_model", "vllm_model_stream")
                await client.open()
                senders = {
                    "plain-grpc": client.grpc_infer("vllm_model", tokenizer),
                    "plain-http": client.http_generate(tokenizer),
                    "stream-grpc": client.grpc_stream(tokenizer),
                }
                for path in triton_paths:
                    progress.set_description(f"{path} (rep {rep + 1})")
                    send = (
                        client.grpc_infer(path[len("extra:") :], tokenizer)
                        if path.startswith("extra:")
                        else senders[path]
                    )
                    for level in levels:
                        record(path, rep, level, await measure(send, prompts, level, server.process.pid, progress))
                await client.close()
            finally:
                server.stop()
    progress.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    parser.add_argument("--max-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--paths",
        type=lambda s: s.split(","),
        default=["bare", "vllm-serve", "plain-grpc", "plain-http", "stream-grpc"],
    )
    parser.add_argument("--extra-model", action="append", default=[])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests per level")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench")
    parser.add_argument("--bare-worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.bare_worker:
        spec_file, out_file = args.bare_worker
        out_file.write_text(json.dumps(asyncio.run(bare_worker(json.loads(spec_file.read_text())))))
        return 0

    started = time.time()
    results = asyncio.run(run_all(args))
    rows = summarize(results)
    doc = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "engine_overrides": BENCH_ENGINE_OVERRIDES,
        "summary": rows,
        "runs": [asdict(r) for r in results],
    }
    (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    plot(rows, args.out / "bench.png")
    print_table(rows)
    print(f"\nresults: {args.out / 'results.json'}  plot: {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
