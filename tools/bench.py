"""Side-by-side benchmark: bare vLLM, `vllm serve`, the Triton vLLM backend and our ensembles, in one run, with the
same model, engine args and engine environment (those of one deployment file).

    .venv/bin/python tools/bench.py [--deployment FILE] [--set NAME=VALUE] [--levels 1,16,64,256]
        [--max-tokens 64,256] [--reps 3] [--paths bare,bare-stream,vllm-serve,plain-grpc,plain-http,stream-grpc]
        [--also-deployment FILE] [--variant PREFIX KEY=VALUE...] [--extra-model NAME] [--extra-stream-model NAME]
        [--vllm-backend DIR]
        [--merge [--fill-to 3]]
        [--interleave [--parallel-starts] [--one-stream-slices 8] [--wave-slices 4]] [--profile [--profile-gil]]
        [--cpu-busy] [--quick]
        [--max-requests 512] [--client-processes 1] [--background-load 0] [--background-load-kind spin]
        [--background-load-alternate] [--out .bench] [--report]

Paths:
  bare          vLLM AsyncLLM in one process (a worker subprocess of this script), FINAL_ONLY outputs: the limit
  bare-stream   the same with DELTA outputs (gives TTFT): the baseline of every streamed path
  bare-delayed  bare with each request held back a random 0 to --bare-delay-ms ms (uniform, seeded; counted in its
                latency) before it reaches the engine: what a wave's requests arriving that spread out cost the engine,
                without a server in between (a diagnostic beside bare, no target)
  bare-front-ends     the bare engine as our server arranges it, without Triton: one EngineCore shared by N
                AsyncLLM clients (N = the deployment's core.front_ends), one in each of N client processes, attached
                as the core's front ends attach; FINAL_ONLY outputs
  bare-front-ends-stream   the same with DELTA outputs
  vllm-serve    vLLM's OpenAI server (python -m vllm.entrypoints.openai.api_server), /v1/completions, aiohttp
  vllm-serve-stream   the same, streamed (gives TTFT)
  plain-grpc    our plain-infer ensemble, gRPC ModelInfer (tritonclient.grpc.aio)
  plain-http    our plain-infer ensemble, HTTP /generate (aiohttp)
  stream-grpc   our streaming ensemble, gRPC bidirectional streams (gives TTFT): one per concurrent slot, reused by
                its requests, as perf_analyzer and the vLLM backend's own client do
  stream-grpc-per-request   the same with a new gRPC stream for every request
  vllm-backend-stream   the Triton vLLM backend in the same server (needs --vllm-backend), gRPC stream
  --extra-model NAME          another model of the same server with the vLLM backend's tensors, gRPC infer
  --extra-stream-model NAME   another decoupled model of the same server, gRPC stream (path extra-stream:NAME)
  --preprocess-model-stream NAME   with core.preprocess_threads: the streaming ensemble as it is without them (the
                preprocess model, then the same core and engine), added as model NAME (path extra-stream:NAME)
  --entry-plain NAME   with entry: ensemble or plain-core, the plain path as `entry: plain-bls` serves it (one
                Python model: the stages in-process, the same core by BLS), added as model NAME beside the
                deployment's plain model (path extra:NAME)

--deployment FILE (default: deployments/default.yaml with BENCH_ENGINE_OVERRIDES, the CPU set-up) is rendered
as it is (engine args, engine_env, instance counts, stream pacing, entry kind); the bare and `vllm serve` paths
get the same engine args and environment, and the prompts come from the deployment's tokenizer.
--also-deployment FILE: another deployment rendered into the same repository (its model names must differ, e.g.
`names:` with a prefix), so a variant is measured in the same server, level by level beside the first:
`--extra-model` / `--extra-stream-model` with its public names. Its engine args should be the deployment's (the bare
and `vllm serve` paths run those of --deployment).
--variant PREFIX KEY=VALUE ...: the same for a variant of --deployment written on the command line: every model name
prefixed with PREFIX, each dotted KEY set to the YAML VALUE (`--variant p12_ generate.instances=12
--extra-model p12_vllm_model`; repo_render/variant.py), checked as a deployment file is.
--vllm-backend DIR: the `src/` folder of a checkout of triton-inference-server/vllm_backend; its model is added to
the rendered repository as `vllm_backend` (same engine args), so it is measured in the same server.

--client-processes K: every path but the bare ones sends each level from K client processes, each with its own
event loop and connection and its share of the streams (tools/bench_clients.py); one Python client driving 256
streams is busy enough to delay the responses it times. The bare paths' client is always the engine's own process.

Each engine starts once per command: the bare worker runs both bare paths, one `vllm serve` both of its paths,
one tritonserver every Triton path; `--reps` repeats the levels inside. By default one engine runs at a time, each
path's levels one after the other. --interleave starts every engine first (they must fit the GPU together) and
measures each level on every path in turn (turn_order: each of ours beside the paths it is compared with; in the
reverse order every other repetition of the level, merged commands included), so the paths compared are measured
seconds apart, not minutes: the table's "paired" column, and the targets where it exists, is the median over the
repetitions of each one's ratio (each repetition's is printed with a target; a target is judged "met" or "NOT met"
from 3 repetitions, the performance issue's rule, and "not judged" from fewer, unless two paired repetitions on one
side of the target already decide the median of three: "met (decided: ...)", "NOT met (decided: ...)").
`--one-stream-slices N` with --interleave measures each one-stream level in N slices of its requests, the turn once
per slice, each path's slices added up to its repetition (results record `slices`): at one stream a path's level is
4-15 s, long enough for the machine's slow spells to fall on one path and not the next (only a path's first slice
warms up: N as large as the level's requests alternates the paths request by request, at 30-50 ms per slice on an
H200). `--wave-slices N` does the same for the levels of several streams, in slices of whole waves (2048 requests at
256 streams are 8 waves: `--wave-slices 4` takes the turn every 2 waves, ~1-3 s a path). `--parallel-starts` with
--interleave starts the first engine alone (on a fresh machine it fills vLLM's compile cache), then launches every
other server or worker at once before waiting for each: on an H100 `vllm serve` and tritonserver took ~60 s each one
after the other. `--merge` adds this command's runs to OUT/results.json (a long run split over several commands: one
table and plot in the end; `--fill-to N` instead of `--reps` measures only the repetitions each level lacks for N,
so a run that a time limit stopped is completed by the next command); `--report` measures nothing and prints
OUT/results.json's table and targets (a run merged on other machines, or one an older bench judged).
Workload: fixed prompts (half short, half ~400 tokens), temperature 0, ignore_eos, each max_tokens, each
concurrency level with 4 requests per stream (--requests-per-stream; at least --min-requests, 8, and at most
--max-requests, 512); one warm-up round per path and level is not counted. Every request is counted as max_tokens
tokens: the engine's own clients (bare, bare-front-ends) count each one's tokens and stop the run on a shortfall,
and each served path, as it opens, is asked once per prompt and max_tokens with its server counting them
(num_output_tokens; `vllm serve`'s usage), so a path that stopped early cannot pass for a fast one (the measured
requests do not ask for counts: that would add work to every response). A level's streams start together, so
with ignore_eos their requests run in waves that start and end in step; --stagger-seconds S spreads the streams'
starts over S seconds (steady-state arrivals: the waves do not form).
Reports per path and level: output tokens/s, requests/s, TTFT p50/p99, end-to-end latency p50/p99, server-side
CPU seconds per 1k output tokens (all processes of the server's process group), the client's own CPU, the ratio
to the baseline (bare for plain paths, bare-stream for streamed ones), the spread (min..max) over repetitions,
the issue's targets, and the machine's own spread per level (bare-stream / bare per round: one engine, seconds
apart with --interleave). --profile adds Triton's per-model statistics (a request's wait in each model's queue
and `execute`, printed per model) and each server process's CPU per level,
the core's own counters in the Triton log, the engine's steps per level for the bare engine and the core alike
(core/step_stats.py: requests running per step, steps per second; from vLLM's iteration details, the share of
steps that computed prompt tokens, the decode-only steps' rate, the EngineCore's wait for the model's result per
step; a core with several front ends counts its steps without their rates), and py-spy profiles (when py-spy is on PATH)
of every Python process of the server (and of the bare engine's worker) during the largest level, or the one
--profile-level names; tools/profile_summary.py prints their busiest functions. With --profile-gil py-spy samples
only the thread that holds each interpreter's GIL: where a process's Python time goes, the waits that release the
GIL (for it, for I/O) left out but those that hold it counted (Triton's stub after each execute). --cpu-busy reads
/proc/stat every 20 ms and keeps, per level, how many CPUs (the engine loop's left out) were busy at once
(tools/cpu_busy.py prints it): whether a wave's boundary fills the machine.
Results go to OUT/results.json (rewritten after every level, so a command stopped by a time limit or a dead server keeps
what it measured; it then exits 1) and OUT/bench.png. --background-load N keeps N CPUs busy for the whole run, to see
how much the engine's own steps slow down when the host's other CPUs are busy (as a server and its clients keep them);
--background-load-kind memory makes them copy memory too (bandwidth and the shared cache), not only spin;
--background-load-alternate runs them in odd repetitions only (paused in even ones) and prints each path's loaded
repetition over the unloaded one just before it: a paired measure of what the busy CPUs cost the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core import engine_lags  # noqa: E402
from core.core_stats import ENVIRONMENT_KEY as CORE_STATS_KEY  # noqa: E402
from core.core_stats import LOG_MARK as CORE_STATS_MARK  # noqa: E402
from core.cpu_placement import EnginePlacement, pin_process  # noqa: E402
from core.engine_lags import EngineLags  # noqa: E402
from core.engine_start_method import DEFAULTS as ENGINE_ENV_DEFAULTS  # noqa: E402
from core.gc_heap import freeze_startup_heap  # noqa: E402
from core.metrics import profiled_engine_args, stat_logger_factory  # noqa: E402
from core.step_stats import EngineSteps, combine, parse_line  # noqa: E402
from repo_render.substitute import set_argument  # noqa: E402
from tools.bench_clients import (  # noqa: E402
    SERVE_MODEL_NAME,
    ClientSpec,
    InProcessRunner,
    ProcessPoolRunner,
    Prompt,
    Runner,
    counting,
    delayed,
    engine_sender,
    generated_tokens,
    open_runner,
    slice_shares,
)
from tools.bench_paths import BARE_DELAY_MS, PATH_CLIENTS, client_of, engine_groups, turn_order  # noqa: E402
from tools.bench_results import LevelResult, ResultsFile, judged, load_runs, plot, print_table  # noqa: E402
from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL  # noqa: E402
from tools.build_tiny_model import build as build_tiny_model  # noqa: E402
from tools.cpu_busy import CpuBusySampler  # noqa: E402
from tools.cpu_busy import summarize as summarize_cpu_busy  # noqa: E402
from tools.gpu_clocks import GpuClockSampler  # noqa: E402
from tools.gpu_clocks import describe as describe_gpu_clocks  # noqa: E402
from tools.gpu_clocks import summarize as summarize_gpu_clocks  # noqa: E402
from tools.machine_facts import describe as describe_machine  # noqa: E402
from tools.triton_server import (  # noqa: E402
    TritonServer,
    free_port,
    interrupt_on_sigterm,
    launch_on_free_ports,
    process_table,
    server_environment,
    start_on_free_ports,
)

# The default (CPU) deployment's engine args get these: room for 400-token prompts + 256 new tokens at
# concurrency 256. A --deployment file is taken as it is.
BENCH_ENGINE_OVERRIDES = {"max_model_len": 1024, "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 256}
VLLM_BACKEND_MODEL = "vllm_backend"
CORE_STATS_SECONDS = 0.5  # --profile: how often the core logs its counters (short: a level lasts seconds)


# Workload ------------------------------------------------------------------------------------------------


def build_prompts(tokenizer_dir: str | Path, count: int = 16) -> list[Prompt]:
    """Half short prompts, half ~400-token prompts, from the shipped corpus (fixed, deterministic), as token ids
    (what the bare engine and `vllm serve` get) and decoded (the Triton paths' text_input)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = tokenizer.encode((ROOT / "tools" / "corpus" / "tiny_corpus.txt").read_text(encoding="utf-8"))
    prompts = []
    for i in range(count):
        start = (i * 97) % (len(ids) - 420)
        length = 8 + (i * 5) % 16 if i % 2 == 0 else 400
        prompt = ids[start : start + length]
        prompts.append(Prompt(prompt, tokenizer.decode(prompt)))
    return prompts


# Requests per level: four per stream, at least DEFAULT_MIN_REQUESTS and at most this many. At 256 streams the cap
# makes a level two waves of requests lasting a few seconds on an H100, which is most of the spread of its ratios
# between leases (docs/performance-gpu.md); --max-requests 1024 gives it four waves, like the other levels, at twice
# the time.
# With 64 tokens every level lasts about a second on the H100 (a few waves): --requests-per-stream lengthens them.
DEFAULT_MAX_REQUESTS = 512
DEFAULT_REQUESTS_PER_STREAM = 4


# At least this many requests per level: a one-stream level of 4 requests per stream would have 4 first tokens.
# Measured on the H100 (docs/performance-gpu.md): with 8 requests per repetition our TTFT p50 at one stream was
# +1.0 to +7.8 ms over the bare engine's, repetition by repetition; with 32, +4.0 and +4.1 ms. --min-requests 32
# costs ~3.5 s per path at 64 tokens and ~14 s at 256.
DEFAULT_MIN_REQUESTS = 8


def requests_for(
    concurrency: int,
    quick: bool,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    per_stream: int = DEFAULT_REQUESTS_PER_STREAM,
    min_requests: int = DEFAULT_MIN_REQUESTS,
) -> int:
    return max(min_requests, min(max_requests, per_stream * concurrency)) // (4 if quick else 1)


def process_group_cpu(pgid: int) -> float:
    return sum(p.cpu_seconds for p in process_table().values() if p.pgid == pgid)


# Server-side observation (--profile) ---------------------------------------------------------------------


def _process_name(pid: int, comm: str) -> str:
    """A server process's name for the report: a Python stub by its model, else its command name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"{comm}:{pid}"
    if argv and argv[0].endswith(b"triton_python_backend_stub") and len(argv) > 1:
        model = Path(argv[1].decode()).parent.parent.name  # .../<model>/<version>/model.py
        return f"stub:{model}:{pid}"
    return f"{comm}:{pid}"


def group_processes(pgid: int) -> dict[int, tuple[str, float]]:
    return {pid: (_process_name(pid, p.comm), p.cpu_seconds) for pid, p in process_table().items() if p.pgid == pgid}


def triton_model_stats(server: TritonServer) -> dict[str, dict[str, float]]:
    """Cumulative per-model counts and times (ms) from Triton's /v2/models/stats."""
    stats = {}
    for name, model in server.model_stats().items():
        inference = model.get("inference_stats", {})
        entry = {"executions": float(model.get("execution_count", 0))}
        for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            item = inference.get(key, {})
            entry[f"{key}_count"] = float(item.get("count", 0))
            entry[f"{key}_ms"] = float(item.get("ns", 0)) / 1e6
        stats[name] = entry
    return stats


class ServerWatch:
    """Per-level deltas of a server's processes' CPU (and Triton's model statistics and the core's engine-step
    lines in its log), for --profile."""

    def __init__(self, pgid: int, triton: TritonServer | None) -> None:
        self.pgid, self.triton = pgid, triton
        self.process_cpu: dict[str, float] | None = None
        self.triton_stats: dict[str, dict[str, float]] | None = None
        self.engine_steps: dict[str, Any] | None = None
        self.engine_lags: dict[str, Any] | None = None
        self.core_stats: list[str] | None = None

    def start(self) -> None:
        self._cpu = group_processes(self.pgid)
        self._stats = triton_model_stats(self.triton) if self.triton is not None else {}
        self._log_offset = len(self.triton.log_text()) if self.triton is not None else 0

    def stop(self) -> None:
        self.process_cpu = {}
        for pid, (name, cpu) in group_processes(self.pgid).items():
            used = cpu - self._cpu.get(pid, (name, 0.0))[1]
            if used > 0.005:
                self.process_cpu[name] = round(used, 3)
        if self.triton is not None:
            self.triton_stats = {}
            for model, now in triton_model_stats(self.triton).items():
                before = self._stats.get(model, {})
                if now.get("success_count", 0) != before.get("success_count", 0):
                    self.triton_stats[model] = {key: round(v - before.get(key, 0.0), 3) for key, v in now.items()}
            time.sleep(CORE_STATS_SECONDS + 0.2)  # the core logs each interval's figures at its end
            lines = self.triton.log_text()[self._log_offset :].splitlines()
            steps = combine([snap for line in lines if (snap := parse_line(line)) is not None])
            self.engine_steps = None if steps is None else steps.as_dict()
            lags = engine_lags.combine([snap for line in lines if (snap := engine_lags.parse_line(line)) is not None])
            self.engine_lags = None if lags is None else lags.as_dict()
            self.core_stats = [core_stats_line(line) for line in lines if CORE_STATS_MARK in line]

    def report(self) -> dict[str, Any]:
        return {
            "process_cpu": self.process_cpu,
            "triton_stats": self.triton_stats,
            "engine_steps": self.engine_steps,
            "engine_lags": self.engine_lags,
            "core_stats": self.core_stats,
        }


def core_stats_line(log_line: str) -> str:
    """The core's counter line (core/core_stats.py) out of a Triton log line (its prefix and quotes dropped)."""
    return log_line[log_line.index(CORE_STATS_MARK) :].rstrip().rstrip('"')


class EngineWatch:
    """The bare engine's steps over a level (--profile), from its own stat logger."""

    def __init__(self, steps: EngineSteps, lags: EngineLags) -> None:
        self.steps, self.lags = steps, lags
        self.engine_steps: dict[str, Any] | None = None
        self.engine_lags: dict[str, Any] | None = None

    def start(self) -> None:
        self.steps.snapshot()  # starts the level's count
        self.lags.snapshot()

    def stop(self) -> None:
        self.engine_steps = self.steps.snapshot().as_dict()
        self.engine_lags = self.lags.snapshot().as_dict()

    def report(self) -> dict[str, Any]:
        return {"engine_steps": self.engine_steps, "engine_lags": self.engine_lags}


def py_spy_command(py_spy: str, pid: int, seconds: float, target: Path, gil: bool = False) -> list[str]:
    """py-spy record of one process: raw collapsed stacks per thread, 200 a second, without pausing it; with `gil`
    only the thread holding the GIL at each sample (a plain profile also counts blocking calls as a thread's time:
    the event loop's select, a send's round trip to tritonserver)."""
    command = [py_spy, "record", "--nonblocking", "--threads", "--format", "raw", "--rate", "200"]
    if gil:
        command.append("--gil")
    return command + ["-d", str(int(seconds)), "-o", str(target), "--pid", str(pid)]


def start_py_spy(pgid: int, seconds: float, out: Path, label: str, gil: bool = False) -> list[subprocess.Popen]:
    """py_spy_command for each Python process of the group; [] when py-spy is not installed."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        print("bench: --profile: py-spy is not on PATH, no stack profiles", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    recorders = []
    for pid, (name, _) in group_processes(pgid).items():
        if not name.startswith(("stub:", "python", "VLLM", "vllm")):
            continue
        target = out / f"{label}-{name.replace(':', '-')}.txt"
        command = py_spy_command(py_spy, pid, seconds, target, gil)
        recorders.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
    return recorders


def start_level_profile(
    args: argparse.Namespace, levels: list[dict[str, Any]], rep: int, level: dict[str, Any], pgid: int, label: str
) -> list[subprocess.Popen]:
    """start_py_spy for the first repetition of the profiled level (--profile); [] for every other."""
    if not (args.profile and rep == 0 and level is profiled_level(levels, args.profile_level)):
        return []
    return start_py_spy(pgid, args.profile_seconds, args.out / "profiles", label, args.profile_gil)


# Servers (the clients are in tools/bench_clients.py) ----------------------------------------------------


def engine_tmp_dir() -> Path:
    """A TMPDIR of its own for one engine process tree of the benchmark (the bare worker, the front ends' launcher,
    `vllm serve`), removed when it stops: vLLM names its ZMQ ipc sockets there (VLLM_RPC_BASE_PATH defaults to it),
    and its processes end without removing them (the bare worker and the launcher left 8 in /tmp in one run of
    tests/integration/test_bench_front_ends.py). Under the system's temporary folder: socket paths must stay under
    108 bytes."""
    return Path(tempfile.mkdtemp(prefix="bench-engine-"))


class VllmServe:
    def __init__(self, engine_args: dict[str, Any], log: Path) -> None:
        self.port = free_port()
        self.engine_args = engine_args
        self.log = log
        self.tmp_dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self._http = None
        self._log_handle = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--served-model-name", SERVE_MODEL_NAME]
        for key, value in self.engine_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                cmd.append(flag)
            elif isinstance(value, (dict, list)):
                cmd += [flag, json.dumps(value)]
            elif value is not False and value is not None:
                cmd += [flag, str(value)]
        return cmd

    def launch(self) -> None:
        """The server's process started; `start` waits for its health (--parallel-starts)."""
        self._log_handle = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.tmp_dir = engine_tmp_dir()
        self.process = subprocess.Popen(
            self.command(),
            env=server_environment(self.tmp_dir),
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def start(self) -> None:
        import aiohttp

        if self.process is None:
            self.launch()
        assert self.process is not None
        self._http = aiohttp.ClientSession()  # for /health only
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
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


# The bare engine, in a worker subprocess (its own process group, so its CPU is counted like a server's) ---
# The worker starts the engine once and then measures one level of one path per command: JSON lines on its stdin,
# each answered by one JSON line on its stdout (vLLM's own output goes to its log), so a level of the bare engine
# can be run between two levels of another path (--interleave).


def start_bare_engine(engine_args: dict[str, Any], engine_cpus: list[int], stat_loggers: list[Any] | None) -> Any:
    """The bare engine in this process (its EngineCore a child): configured as the core configures ours, placed as
    the core places ours (core.engine_cpus; this process then goes to the other CPUs), its start-up heap frozen."""
    from core.engine import prepare_process_environment, start_own_engine

    prepare_process_environment()
    llm = start_own_engine(engine_args, stat_loggers)
    if engine_cpus:
        EnginePlacement(engine_cpus).apply(os.getpid())
    # Frozen as `vllm serve` freezes its own, whatever TRITON_VLLM_GC_FREEZE says (that switch is for our server).
    freeze_startup_heap(switchable=False)
    return llm


async def bare_worker(spec: dict[str, Any], commands: Any, answers: Any) -> None:
    engine_args, stat_loggers, steps, lags = spec["engine_args"], None, None, None
    if spec.get("profile"):  # the engine's steps and lags per level, as the core counts them under --profile
        steps, lags = EngineSteps(), EngineLags()
        engine_args, stat_loggers = profiled_engine_args(engine_args), [stat_logger_factory(steps)]
    llm = start_bare_engine(engine_args, spec["engine_cpus"], stat_loggers)

    on_output = counting(lags) if lags is not None else None
    prompts = [Prompt(ids, "") for ids in spec["prompts"]]
    runners = {
        path: InProcessRunner(engine_sender(llm, path == "bare-stream", "bare", on_output))
        for path in ("bare", "bare-stream")
    }
    delayed_send = delayed(engine_sender(llm, False, "bare-delayed", on_output), spec["delay"])
    runners["bare-delayed"] = InProcessRunner(delayed_send)
    loop = asyncio.get_running_loop()
    try:
        answers.write(json.dumps({"ready": True}) + "\n")
        answers.flush()
        while line := await loop.run_in_executor(None, commands.readline):
            command = json.loads(line)
            watch = None if steps is None or lags is None else EngineWatch(steps, lags)
            measured = await measure(runners[command["path"]], prompts, command["level"], os.getpgid(0), None, watch)
            answers.write(json.dumps(measured) + "\n")
            answers.flush()
    finally:
        llm.shutdown()


def bare_worker_main(spec_file: Path) -> None:
    asyncio.run(bare_worker(json.loads(spec_file.read_text()), *worker_streams()))


async def measure(
    runner: Runner, prompts: list[Prompt], level: dict[str, Any], pgid: int | None, progress, watch=None
) -> dict[str, Any]:
    await runner.prepare(  # the warm-up round
        prompts,
        level["concurrency"],
        level["requests"],
        level["max_tokens"],
        level["stagger"],
        # A later slice follows the path's earlier one by a few seconds: warm, no warm-up request (which would
        # double the time of one-request slices, --one-stream-slices; --wave-slices)
        warm=level.get("slice", 0) > 0,
    )
    cpu_before = process_group_cpu(pgid) if pgid else None
    if watch is not None:
        watch.start()
    started = time.time()  # the wall clock: the bare worker's measurements are timed in its own process
    run = await runner.run(progress)
    ended = time.time()
    if watch is not None:
        watch.stop()
    cpu = process_group_cpu(pgid) - cpu_before if pgid else None
    return {
        "span": [started, ended],  # for the GPU's samples in it (record, in measure_all), not kept
        "wall": run.wall,
        "output_tokens": sum(s.output_tokens for s in run.samples),
        "cpu_seconds": cpu,
        "latencies": [round(s.latency, 5) for s in run.samples],
        "waves": [s.wave for s in run.samples],
        "ttfts": [round(s.ttft, 5) for s in run.samples if s.ttft is not None],
        "client_cpu_seconds": run.client_cpu_seconds,
        # the bare-front-ends paths' client processes count their own trips to and from the EngineCore
        **({} if run.engine_lags is None else {"engine_lags": run.engine_lags}),
        **({} if watch is None else watch.report()),
    }


def numbered_on(waves: list[list[int]]) -> list[int]:
    """Slices' wave numbers (each from 0) as one level's: each slice's go on from the slice before's last."""
    numbered: list[int] = []
    for part in waves:
        start = max(numbered, default=-1) + 1
        numbered += [start + wave for wave in part]
    return numbered


def add_slices(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One path's slices of a level (measure's results, level_slices) as one measurement: its time, tokens and
    CPU added up, its requests' latencies and first tokens together, each slice's waves numbered on from the slice
    before's. (--profile's per-level readings are refused with slices: they describe one stretch of time.)"""

    def total(key: str) -> float | None:
        values = [part[key] for part in parts]
        return None if any(value is None for value in values) else sum(values)

    return {
        "gpu_samples": [sample for part in parts for sample in part["gpu_samples"]],
        "wall": total("wall"),
        "output_tokens": total("output_tokens"),
        "cpu_seconds": total("cpu_seconds"),
        "latencies": [latency for part in parts for latency in part["latencies"]],
        "waves": numbered_on([part["waves"] for part in parts]),
        "ttfts": [ttft for part in parts for ttft in part["ttfts"]],
        "client_cpu_seconds": total("client_cpu_seconds"),
    }


class SlicedLevels:
    """--one-stream-slices, --wave-slices: each path's slices of a level held until the last one is in, then added
    up."""

    def __init__(self) -> None:
        self._parts: dict[tuple[str, int, int, int], list[dict[str, Any]]] = {}

    def complete(self, path: str, rep: int, level: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any] | None:
        """The path's whole measurement of the level's repetition once `measured` completes it, else None."""
        slices = level.get("slices", 1)
        if slices == 1:
            return measured
        key = (path, rep, level["max_tokens"], level["concurrency"])
        parts = self._parts.setdefault(key, [])
        parts.append(measured)
        if len(parts) < slices:
            return None
        return add_slices(self._parts.pop(key))


# Engine groups: one engine start each, measured a level of a path at a time ---------------------------------


class WorkerProcess:
    """A subprocess of this script (`--bare-worker` or `--front-ends-launcher` with a spec file) in its own session
    (so its CPU, its engine's included, is counted like a server's), answering JSON lines: the first says its
    engine is up; closing its stdin ends it."""

    def __init__(self, flag: str, spec: dict[str, Any], log: Path) -> None:
        self.flag, self.spec, self.log = flag, spec, log
        self.tmp_dir: Path | None = None
        self.process: asyncio.subprocess.Process | None = None

    async def launch(self) -> None:
        """The subprocess started; `start` waits for its engine (--parallel-starts: the waits come after every
        launch, so the engines boot together)."""
        spec_file = self.log.with_suffix(".json")
        spec_file.write_text(json.dumps(self.spec))
        self.tmp_dir = engine_tmp_dir()
        with open(self.log, "wb") as log_handle:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                self.flag,
                str(spec_file),
                env=server_environment(self.tmp_dir),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_handle,
                start_new_session=True,
                limit=1 << 26,  # one answer holds every request's latency
            )

    async def start(self) -> None:
        if self.process is None:
            await self.launch()
        await self.answer()  # ready: the engine is up

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        await self.process.stdin.drain()
        return await self.answer()

    async def answer(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            await self.process.wait()
            raise RuntimeError(f"{self.flag} process failed ({self.process.returncode}); see {self.log}")
        return json.loads(line)

    async def stop(self) -> None:
        try:
            if self.process is None or self.process.returncode is not None:
                return
            assert self.process.stdin is not None
            self.process.stdin.close()  # the worker shuts its engine down and exits
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except TimeoutError:
                os.killpg(self.process.pid, signal.SIGKILL)
                await self.process.wait()
        finally:
            if self.tmp_dir is not None:
                shutil.rmtree(self.tmp_dir, ignore_errors=True)


def worker_streams() -> tuple[Any, Any]:
    """A worker process's command and answer streams: answers go to the stdout it was started with; everything
    else printed (vLLM's logs included) goes to its stderr, the log file."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return sys.stdin, answers


class BareGroup:
    """The bare paths: the engine in its worker subprocess."""

    def __init__(self, args, paths: list[str], levels: list[dict[str, Any]], spec: dict[str, Any], log: Path) -> None:
        self.args, self.paths, self.levels = args, paths, levels
        self.worker = WorkerProcess("--bare-worker", spec, log)

    async def launch(self) -> None:
        await self.worker.launch()

    async def open(self) -> None:
        await self.worker.start()

    async def measure(self, path: str, rep: int, level: dict[str, Any], progress) -> dict[str, Any]:
        # the worker and its EngineCore, as a server's processes are (its own session: pgid = pid)
        recorders = start_level_profile(self.args, self.levels, rep, level, self.worker.pid, path)
        measured = await self.worker.ask({"path": path, "level": level})
        for recorder in recorders:
            recorder.wait(timeout=self.args.profile_seconds + 30)
        progress.update(level["requests"])
        return measured

    async def close(self) -> None:
        await self.worker.stop()


# The bare engine shared by front ends: one EngineCore, started by a launcher subprocess, and one AsyncLLM client in
# each of N client processes, attached to it as the core's N front ends attach to theirs (core/front_ends.py, N =
# the deployment's core.front_ends). The engine's arrangement in our server, without Triton: what separates the
# bare engine (one in-process client) from it, and it from ours.


def front_ends_launcher(spec: dict[str, Any], commands: Any, answers: Any) -> None:
    from core import front_ends
    from core.engine import prepare_process_environment

    prepare_process_environment()
    fe = front_ends.FrontEnd(0, spec["front_ends"], Path(spec["socket_dir"]))
    config, executor = front_ends.vllm_config(spec["engine_args"])
    launched = front_ends.launch_engine(config, executor, fe, front_ends.stats_logged(spec["engine_args"], None))
    try:
        if spec["engine_cpus"]:  # placed as the core places ours (core.engine_cpus)
            EnginePlacement(spec["engine_cpus"]).apply(os.getpid())
        answers.write(json.dumps({"ready": True, "engine_pids": launched.pids}) + "\n")
        answers.flush()
        commands.read()  # until this script closes it
    finally:
        launched.shutdown()


class FrontEndsGroup:
    """The bare-front-ends paths: the launcher subprocess's EngineCore, and one pool of client processes, each an
    engine front end, for both paths (their processes' CPU is the client's, as the bare worker's own is not)."""

    def __init__(self, args, paths, levels, prompts, setup: BenchSetup) -> None:
        self.args, self.paths, self.levels, self.prompts, self.setup = args, paths, levels, prompts, setup
        self.socket_dir: Path | None = None
        self.launcher: WorkerProcess | None = None
        self.pool: ProcessPoolRunner | None = None

    async def launch(self) -> None:
        self.socket_dir = Path(tempfile.mkdtemp(prefix="bench-fe-"))  # short: IPC paths fit 107 bytes
        setup, count = self.setup, self.setup.front_ends
        spec = {
            # statistics on under --profile, as the bare engine's (the engine's steps are not collected for these
            # paths; each client process's trips to and from the EngineCore are: "profile")
            "engine_args": profiled_engine_args(setup.engine_args) if self.args.profile else setup.engine_args,
            "engine_cpus": setup.engine_cpus,
            "front_ends": count,
            "socket_dir": str(self.socket_dir),
            "profile": self.args.profile,  # each client process then counts its trips to and from the EngineCore
        }
        self.launcher = WorkerProcess("--front-ends-launcher", spec, self.args.out / "front-ends.log")
        await self.launcher.launch()

    async def open(self) -> None:
        if self.launcher is None:
            await self.launch()
        assert self.launcher is not None
        await self.launcher.start()
        spec_file = str(self.launcher.log.with_suffix(".json"))
        self.pool = ProcessPoolRunner(ClientSpec(client_of(self.paths[0]), spec_file, ""), self.setup.front_ends)

    async def measure(self, path: str, rep: int, level: dict[str, Any], progress) -> dict[str, Any]:
        assert self.pool is not None and self.launcher is not None
        recorders = start_level_profile(self.args, self.levels, rep, level, self.launcher.pid, path)
        measured = await measure(self.pool.as_kind(client_of(path)), self.prompts, level, self.launcher.pid, progress)
        for recorder in recorders:
            recorder.wait(timeout=self.args.profile_seconds + 30)
        return measured

    async def close(self) -> None:
        try:
            if self.pool is not None:
                await self.pool.close()
        finally:
            if self.launcher is not None:
                await self.launcher.stop()
            if self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)


def token_shortfall(path: str, max_tokens: int, counts: list[int]) -> str | None:
    """What is wrong with a path's generated tokens, one count per request (None: each made max_tokens): with
    ignore_eos each must, or the path's tok/s does not compare with the others'."""
    wrong = [count for count in counts if count != max_tokens]
    if not wrong:
        return None
    return (
        f"{path} generated {', '.join(map(str, sorted(set(wrong))))} tokens in {len(wrong)} of {len(counts)} "
        f"requests with max_tokens {max_tokens} and ignore_eos, not {max_tokens}: its tok/s would not compare"
    )


async def check_generated_tokens(
    specs: dict[str, ClientSpec], prompts: list[Prompt], levels: list[dict[str, Any]]
) -> None:
    """Each served path's tokens for each prompt at each max_tokens of the run's levels, counted by its server, before
    anything is measured (tools/bench_clients.py: measured requests take max_tokens on trust). Raises on a shortfall."""
    token_counts = sorted({level["max_tokens"] for level in levels})
    concurrency = max(level["concurrency"] for level in levels)
    maxima = ", ".join(map(str, token_counts))
    for path, spec in specs.items():
        for max_tokens in token_counts:
            counts = await generated_tokens(spec, prompts, max_tokens, concurrency)
            if (problem := token_shortfall(path, max_tokens, counts)) is not None:
                raise RuntimeError(f"token check: {problem}")
        print(
            f"bench: token check: {path} generated max_tokens ({maxima}) for each of {len(prompts)} prompts",
            file=sys.stderr,
        )


async def close_all(closers: Iterable[Callable[[], Awaitable[None]]]) -> None:
    """Call every closer even if one fails (then raise the first failure): a run stopped midway still stops every
    server and worker it started."""
    failure: BaseException | None = None
    for close in closers:
        try:
            await close()
        except BaseException as exc:  # noqa: BLE001 - raised once the others are closed too
            failure = failure or exc
    if failure is not None:
        raise failure


class ServedGroup:
    """The paths of one server (tritonserver or `vllm serve`): a client runner per path, --profile's watches."""

    def __init__(self, args: argparse.Namespace, paths: list[str], levels: list[dict[str, Any]], prompts) -> None:
        self.args, self.paths, self.levels, self.prompts = args, paths, levels, prompts
        self.runners: dict[str, Runner] = {}
        self.pgid = 0
        self.triton: TritonServer | None = None

    async def launch(self) -> None:
        """The server's process started, its readiness left to `open` (--parallel-starts)."""
        raise NotImplementedError

    async def open_server(self) -> dict[str, ClientSpec]:
        raise NotImplementedError

    async def close_server(self) -> None:
        raise NotImplementedError

    async def open(self) -> None:
        specs = await self.open_server()
        await check_generated_tokens(specs, self.prompts, self.levels)
        for path, spec in specs.items():
            self.runners[path] = await open_runner(spec, self.args.client_processes)

    async def measure(self, path: str, rep: int, level: dict[str, Any], progress) -> dict[str, Any]:
        args = self.args
        watch = ServerWatch(self.pgid, self.triton) if args.profile else None
        recorders = start_level_profile(args, self.levels, rep, level, self.pgid, path)
        measured = await measure(self.runners[path], self.prompts, level, self.pgid, progress, watch)
        for recorder in recorders:
            recorder.wait(timeout=args.profile_seconds + 30)
        return measured

    async def close(self) -> None:
        try:
            await close_all(runner.close for runner in self.runners.values())
        finally:
            await self.close_server()


class TritonGroup(ServedGroup):
    def __init__(self, args, paths, levels, prompts, setup: BenchSetup) -> None:
        super().__init__(args, paths, levels, prompts)
        self.setup = setup
        self.server: TritonServer | None = None

    def _environment(self) -> dict[str, str] | None:
        # --profile: the core logs its counters, and the engine's steps, every CORE_STATS_SECONDS (core/core_stats.py)
        return {CORE_STATS_KEY: str(CORE_STATS_SECONDS)} if self.args.profile else None

    async def launch(self) -> None:
        log = self.args.out / "triton.log"
        self.server = launch_on_free_ports(self.setup.repo, log, environment=self._environment())

    async def open_server(self) -> dict[str, ClientSpec]:
        # waits for the launched server (--parallel-starts), else starts one; either is started again once if it
        # exits before it is ready
        self.server = start_on_free_ports(
            self.setup.repo, self.args.out / "triton.log", environment=self._environment(), launched=self.server
        )
        assert self.server.process is not None
        self.triton, self.pgid = self.server, self.server.process.pid
        return triton_client_specs(self.paths, self.setup, self.server)

    async def close_server(self) -> None:
        if self.server is not None:
            self.server.stop()


class VllmServeGroup(ServedGroup):
    def __init__(self, args, paths, levels, prompts, setup: BenchSetup) -> None:
        super().__init__(args, paths, levels, prompts)
        self.setup = setup
        self.serve = VllmServe(setup.engine_args, args.out / "vllm-serve.log")

    async def launch(self) -> None:
        self.serve.launch()

    async def open_server(self) -> dict[str, ClientSpec]:
        await self.serve.start()  # waits for the launched server (--parallel-starts), else starts it
        assert self.serve.process is not None
        if self.setup.engine_cpus:  # placed as the core places ours (core.engine_cpus)
            EnginePlacement(self.setup.engine_cpus).apply(self.serve.process.pid)
        self.pgid = self.serve.process.pid
        address = f"127.0.0.1:{self.serve.port}"
        return {path: ClientSpec(client_of(path), address, SERVE_MODEL_NAME) for path in self.paths}

    async def close_server(self) -> None:
        await self.serve.stop()


Group = BareGroup | FrontEndsGroup | TritonGroup | VllmServeGroup


async def start_groups(
    groups: Sequence[Any],
    launch: Callable[[Any], Awaitable[None]],
    start: Callable[[Any], Awaitable[None]],
    together: bool,
) -> None:
    """--interleave: every group's engine up before the first level. The first alone (on a fresh machine it fills
    vLLM's compile cache, which the later starts then read). With `together` (--parallel-starts) every other group's
    process is launched next, and only then each waited for in turn: they boot at once, while all the waiting stays
    in this one task (a signal's KeyboardInterrupt lands here, and the run's `finally` closes what was launched).
    Else one after the other."""
    first, rest = groups[:1], groups[1:]
    for group in first if together else groups:
        await start(group)
    if not together:
        return
    for group in rest:
        await launch(group)
    for group in rest:
        await start(group)


def interleaved_turn(groups: list[Any]) -> list[str]:
    """The paths of --interleave's turn in their order (turn_order over the groups' paths): the schedule's order,
    and each run's recorded turn_index."""
    return turn_order([path for group in groups for path in group.paths])


def level_slices(level: dict[str, Any], one_stream: int = 1, waves: int = 1) -> list[dict[str, Any]]:
    """A level as the slices it is measured in, each knowing its place and the whole level's requests (the level
    itself when it is measured whole).

    `one_stream` (--one-stream-slices): a one-stream level's requests shared out. At one stream a request takes
    0.1-0.5 s, so a level of 32 is 4-15 s a path, long enough for the machine's slow spells to fall on one path's
    level and not the next one's; slices of a few requests, the turn once per slice, put the paths compared within
    a second or two of each other. Only a path's first slice of a repetition warms up (measure): with as many slices
    as requests, each path's requests alternate with the others' one by one at the cost of the level's own requests.

    `waves` (--wave-slices): a level of several streams in that many slices of whole waves (each stream's requests
    shared out; any requests beyond whole waves go with the last slice). Its streams start together, so each slice
    is a run of the waves that the whole level is made of, and the paths compared take turns every few waves:
    the machine's slow spells of a few seconds (docs/performance-gpu.md) then fall on both instead of on one."""
    concurrency = level["concurrency"]
    slices = one_stream if concurrency == 1 else waves
    if slices <= 1:
        return [level]
    requests = level["requests"]
    shares = slice_shares(requests, concurrency, slices)
    if len(shares) <= 1:
        return [level]
    return [
        {**level, "requests": share, "slice": index, "slices": len(shares), "level_requests": requests}
        for index, share in enumerate(shares)
    ]


def schedule(
    groups: list[Any],
    levels: list[dict[str, Any]],
    interleave: bool,
    reps_of: Callable[[dict[str, Any]], int],
    done: Callable[[dict[str, Any]], int] = lambda level: 0,
    one_stream_slices: int = 1,
    wave_slices: int = 1,
):
    """The order of the measurements, as (group, path, rep, level). One after the other: every level of a path
    before the next path, every path of a group before the next group. Interleaved: each level of one repetition
    is measured on every path in turn before the next level, so paths compared with each other are measured
    seconds apart, not minutes (the machine's own speed drifts more than that: docs/performance-gpu.md); in the
    reverse order in every other repetition of the level (`done(level)`: its repetitions already in a merged
    results file), so that a path's place in the turn (first after the level before, or last) is not part of
    its paired ratio. `reps_of(level)`: the level's repetitions (--reps, or what --fill-to found lacking).
    `one_stream_slices`, `wave_slices` (interleaved only): a level in that many slices (level_slices), the turn once
    per slice, reversed every other slice."""
    rounds = range(max((reps_of(level) for level in levels), default=0))
    if interleave:
        group_of = {path: group for group in groups for path in group.paths}
        turn = [(group_of[path], path) for path in interleaved_turn(groups)]
        return [
            (group, path, rep, part)
            for rep in rounds
            for level in levels
            if rep < reps_of(level)
            for part in level_slices(level, one_stream_slices, wave_slices)
            for group, path in (turn if (done(level) + rep + part.get("slice", 0)) % 2 == 0 else turn[::-1])
        ]
    return [
        (group, path, rep, level)
        for group in groups
        for rep in rounds
        for path in group.paths
        for level in levels
        if rep < reps_of(level)
    ]


# The repository ------------------------------------------------------------------------------------------


@dataclass
class BenchSetup:
    repo: Path
    engine_args: dict[str, Any]  # as the core reads them (paths resolved)
    engine_env: dict[str, str]
    tokenizer: str
    plain: str
    streaming: str
    engine_cpus: list[int] = field(default_factory=list)  # the deployment's core.engine_cpus
    front_ends: int = 1  # the deployment's core.front_ends
    # the core.engine_cpus of its variants and --also-deployment's beside it in the server, which are not the
    # deployment's: kept free of the benchmark's own processes too
    other_engine_cpus: list[int] = field(default_factory=list)


def bench_repository(
    out: Path,
    deployment_file: Path | None,
    variables: dict[str, str],
    also: Sequence[Path] = (),
    preprocess_model_stream: str | None = None,
    entry_plain: str | None = None,
    variants: Sequence[list[str]] = (),
) -> BenchSetup:
    """Render the deployment into OUT/repo (the default one with BENCH_ENGINE_OVERRIDES when none is given), and
    the `also` deployments next to it (--also-deployment: their model names must differ from its), and the
    `variants` of it ([PREFIX, KEY=VALUE, ...] each, --variant: repo_render/variant.py).
    `preprocess_model_stream` (--preprocess-model-stream NAME) adds the streaming ensemble as it is without
    core.preprocess_threads (the preprocess model, then the same core) as model NAME. `entry_plain` (--entry-plain
    NAME) adds the plain entry model of `entry: plain-bls` (the stages in-process, the same core by BLS) as NAME."""
    from core.engine_config import load_engine_args
    from repo_render import DEFAULT_CONFIG, ConfigError, load_deployment, render, render_together, write
    from repo_render.variant import load_variant, setting

    source = deployment_file or DEFAULT_CONFIG
    deployment = load_deployment(source, variables)
    try:
        own = [
            load_variant(source, prefix, [setting(s) for s in settings], variables) for prefix, *settings in variants
        ]
        others = [load_deployment(extra, variables) for extra in also]
    except ConfigError as exc:
        raise SystemExit(f"bench: --also-deployment / --variant: {exc}") from None
    if deployment_file is None:
        build_tiny_model(TINY_MODEL)
        for each in (deployment, *own):  # the deployment's variants run its engine args
            each.engine_args = {**each.engine_args, **BENCH_ENGINE_OVERRIDES}
    repo = out / "repo"
    try:
        files = render_together([deployment, *own, *others], repo)
    except ConfigError as exc:
        raise SystemExit(f"bench: --also-deployment / --variant: {exc}") from None
    if preprocess_model_stream is not None:
        if not deployment.core.preprocess_threads:
            raise SystemExit("bench: --preprocess-model-stream needs a deployment with core.preprocess_threads")
        # Only the ensemble is taken: its steps are the deployment's own preprocess model and core, which takes
        # ENGINE_REQUEST from any caller (a BLS caller's way in), so both ensembles share one core and engine.
        core = deployment.core.model_copy(update={"preprocess_threads": 0})
        names = deployment.names.model_copy(update={"streaming": preprocess_model_stream})
        staged = deployment.model_copy(update={"core": core, "names": names})
        staged_files = render(staged, repo)
        _add_variant_model(files, staged_files, preprocess_model_stream, "--preprocess-model-stream")
        if not any(rel.startswith(deployment.names.preprocess + "/") for rel in files):
            # Nothing of the deployment calls the preprocess model (the plain path does not: entry plain-core or
            # plain-bls), so it was not rendered: the added ensemble's first step is taken too.
            _add_variant_model(files, staged_files, deployment.names.preprocess, "--preprocess-model-stream")
    if entry_plain is not None:
        if deployment.entry not in ("ensemble", "plain-core"):
            raise SystemExit(
                "bench: --entry-plain needs a deployment with entry: ensemble or plain-core (its plain path is the"
                " other)"
            )
        # Only the plain entry model is taken: it calls the deployment's own core by BLS with ENGINE_REQUEST, as
        # generate does, so both plain paths share one core and engine.
        names = deployment.names.model_copy(update={"plain": entry_plain})
        entry = deployment.model_copy(update={"entry": "plain-bls", "names": names})
        _add_variant_model(files, render(entry, repo), entry_plain, "--entry-plain")
    write(files, repo)
    engine_args = load_engine_args(repo / deployment.names.core / "1" / "model.json")
    return BenchSetup(
        repo,
        engine_args,
        dict(deployment.engine_env),
        str(engine_args.get("tokenizer", engine_args["model"])),
        deployment.names.plain,
        deployment.names.streaming,
        list(deployment.core.engine_cpus),
        deployment.core.front_ends,
        sorted({cpu for each in (*own, *others) for cpu in each.core.engine_cpus} - set(deployment.core.engine_cpus)),
    )


def _add_variant_model(files: dict[str, str], variant: dict[str, str], name: str, flag: str) -> None:
    """Model `name`'s files from a variant's rendering, added to the repository's (a model of that name already
    there would have its files replaced: refused)."""
    folder = name + "/"
    if any(rel.startswith(folder) for rel in files):
        raise SystemExit(f"bench: {flag} {name}: a model of that name exists")
    files.update({rel: text for rel, text in variant.items() if rel.startswith(folder)})


def add_vllm_backend(setup: BenchSetup, source: Path) -> None:
    """The Triton vLLM backend's model (its src/: model.py and utils/) as model `vllm_backend` of the rendered
    repository, with the same engine args. Its code is copied at run time, never committed here."""
    if not (source / "model.py").is_file():
        raise SystemExit(f"bench: --vllm-backend {source}: no model.py (give the checkout's src/ folder)")
    version = setup.repo / VLLM_BACKEND_MODEL / "1"
    if version.exists():
        shutil.rmtree(version)
    shutil.copytree(source, version, ignore=shutil.ignore_patterns("__pycache__"))
    # vLLM >= 0.2x moved TokensPrompt out of vllm.inputs.data; the backend's HEAD still imports it from there.
    request = version / "utils" / "request.py"
    if request.is_file():
        text = request.read_text()
        try:
            import vllm.inputs.data  # noqa: F401
        except ImportError:
            text = text.replace("from vllm.inputs.data import TokensPrompt", "from vllm.inputs import TokensPrompt")
        request.write_text(text)
    # The 2.51 stub runs with LC_CTYPE=C, where importing vLLM fails (torch reads its templates as ASCII); our core
    # sets C.UTF-8 first (core/engine.py prepare_process_environment), so the backend gets the same line.
    model = version / "model.py"
    model.write_text('import locale\nlocale.setlocale(locale.LC_CTYPE, "C.UTF-8")\n' + model.read_text())
    (version / "model.json").write_text(json.dumps(setup.engine_args, indent=2))
    (setup.repo / VLLM_BACKEND_MODEL / "config.pbtxt").write_text(
        f'name: "{VLLM_BACKEND_MODEL}"\nbackend: "python"\ninstance_group [ {{ count: 1 kind: KIND_MODEL }} ]\n'
    )


# The run -------------------------------------------------------------------------------------------------


def levels_for(args: argparse.Namespace) -> list[dict[str, Any]]:
    def requests(concurrency: int) -> int:
        return requests_for(concurrency, args.quick, args.max_requests, args.requests_per_stream, args.min_requests)

    return [
        {"concurrency": c, "max_tokens": m, "requests": requests(c), "stagger": args.stagger_seconds}
        for m in args.max_tokens
        for c in args.levels
    ]


def profile_level_argument(text: str) -> tuple[int, int]:
    concurrency, _, max_tokens = text.partition("x")
    try:
        return int(concurrency), int(max_tokens)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: STREAMSxTOKENS, e.g. 64x64") from None


def profiled_level(levels: list[dict[str, Any]], chosen: tuple[int, int] | None = None) -> dict[str, Any]:
    """The level py-spy records: `chosen` (concurrency, max_tokens), else the largest. A chosen level that the run
    does not measure is refused (SystemExit) rather than silently replaced."""
    if chosen is None:
        return max(levels, key=lambda level: (level["concurrency"], level["max_tokens"]))
    for level in levels:
        if chosen == (level["concurrency"], level["max_tokens"]):
            return level
    raise SystemExit(f"bench: --profile-level {chosen[0]}x{chosen[1]} is not one of this run's levels")


def triton_client_specs(paths: list[str], setup: BenchSetup, server: TritonServer) -> dict[str, ClientSpec]:
    models = {
        "plain-grpc": setup.plain,
        "plain-http": setup.plain,
        "stream-grpc": setup.streaming,
        "stream-grpc-per-request": setup.streaming,
        "vllm-backend-stream": VLLM_BACKEND_MODEL,
    }
    specs = {}
    for path in paths:
        kind = client_of(path)
        model = models[path] if path in models else path.split(":", 1)[1]  # extra:NAME, extra-stream:NAME
        specs[path] = ClientSpec(kind, server.http_url if kind.startswith("http") else server.grpc_url, model)
    return specs


def path_list(text: str) -> list[str]:
    """--paths: comma-separated names of PATH_CLIENTS; an unknown one is refused (no group would measure it)."""
    paths = [p for p in text.split(",") if p]
    unknown = [p for p in paths if p not in PATH_CLIENTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown path {', '.join(unknown)}; one of {', '.join(PATH_CLIENTS)}")
    return paths


def measured_paths(args: argparse.Namespace) -> list[str]:
    """--paths, then the paths of --extra-model and --extra-stream-model."""
    return [
        *args.paths,
        *(f"extra:{n}" for n in args.extra_model),
        *(f"extra-stream:{n}" for n in args.extra_stream_model),
        *([f"extra-stream:{args.preprocess_model_stream}"] if args.preprocess_model_stream else []),
        *([f"extra:{args.entry_plain}"] if args.entry_plain else []),
    ]


def repetitions_of(args: argparse.Namespace, results: ResultsFile) -> Callable[[dict[str, Any]], int]:
    """Each level's repetitions in this command: --reps, or with --fill-to those the merged file lacks (printed)."""
    if args.fill_to is None:
        return lambda level: args.reps
    paths = measured_paths(args)
    needed = {
        (level["max_tokens"], level["concurrency"]): results.repetitions_lacking(level, paths, args.fill_to)
        for level in levels_for(args)
    }
    plan = ", ".join(f"{m} tokens x {c}: {n}" for (m, c), n in needed.items())
    print(f"bench: --fill-to {args.fill_to}, repetitions to measure: {plan}", file=sys.stderr)
    return lambda level: needed[(level["max_tokens"], level["concurrency"])]


async def run_all(
    args: argparse.Namespace,
    on_result: Callable[[LevelResult], None],
    done: Callable[[dict[str, Any]], int],
    reps_of: Callable[[dict[str, Any]], int],
) -> None:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    setup = bench_repository(
        out,
        args.deployment,
        args.variables,
        args.also_deployment,
        args.preprocess_model_stream,
        args.entry_plain,
        args.variant,
    )
    if args.vllm_backend is not None:
        add_vllm_backend(setup, args.vllm_backend)
    elif "vllm-backend-stream" in args.paths:
        raise SystemExit("bench: the path vllm-backend-stream needs --vllm-backend DIR")
    # The core's default engine environment, then the deployment's: server_environment() copies both into every
    # engine process of every path (`vllm serve` and the bare engine start theirs as the core does).
    os.environ.update({**ENGINE_ENV_DEFAULTS, **setup.engine_env})
    if setup.engine_cpus or setup.other_engine_cpus:
        # Every path's engine on the deployment's engine CPUs (a variant's beside it on its own), everything else
        # (this client and its client processes, the servers, the bare engine's other threads) off all of them:
        # this process first, so each server started below inherits the rest. A variant's loop shares its CPU
        # with nothing of ours either, or the variant is not measured alike (docs/performance-gpu.md, session 49).
        placement = EnginePlacement([*setup.engine_cpus, *setup.other_engine_cpus])
        pin_process(os.getpid(), placement.other_cpus)
        print(f"bench: {placement.describe()}", file=sys.stderr)
    # Started after this process took its CPUs, so the busy loops inherit them and never share the engine's.
    with busy_processes(args.background_load, args.background_load_kind) as load:
        await measure_all(args, setup, on_result, done, load, reps_of)


# --background-load-kind: what each busy process does. `spin` keeps a CPU busy and little else; `memory` copies
# 256 MiB into another 256 MiB over and over (a memmove, no page faults), so it also takes memory bandwidth and
# evicts the last-level cache that CPUs share (as a server's busy processes may, beside a CPU-bound EngineCore).
# `objects` builds and drops 200,000 small dicts over and over (~50 MB): a Python server's allocation churn, between
# the two.
BACKGROUND_LOADS = {
    "spin": "while True: pass",
    "memory": "source, target = bytearray(256 << 20), bytearray(256 << 20)\nwhile True: target[:] = source",
    "objects": "while True: [{'id': i, 'text': str(i) * 8} for i in range(200_000)]",
}


class BackgroundLoad:
    """--background-load's busy processes. `run(False)` pauses them (SIGSTOP) and `run(True)` lets them go on
    (SIGCONT), so --background-load-alternate can load every other repetition of a run."""

    def __init__(self, processes: list[subprocess.Popen[bytes]]) -> None:
        self.processes = processes
        self.running = len(processes)

    def run(self, running: bool) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGCONT if running else signal.SIGSTOP)
        self.running = len(self.processes) if running else 0


@contextlib.contextmanager
def busy_processes(count: int, kind: str = "spin", cpus: Sequence[int] = ()) -> Iterator[BackgroundLoad]:
    """`count` busy processes of `kind` (--background-load) for the block's duration, on this process's CPUs, or the
    i-th on `cpus[i]` alone where given (tools/measure_cpu_interference.py)."""
    load = [subprocess.Popen([sys.executable, "-c", BACKGROUND_LOADS[kind]]) for _ in range(count)]
    for process, cpu in zip(load, cpus, strict=False):
        os.sched_setaffinity(process.pid, {cpu})
    try:
        yield BackgroundLoad(load)
    finally:
        for process in load:
            process.kill()  # a stopped process is killed too
            process.wait()


async def measure_all(
    args: argparse.Namespace,
    setup: BenchSetup,
    on_result: Callable[[LevelResult], None],
    done: Callable[[dict[str, Any]], int],
    load: BackgroundLoad,
    reps_of: Callable[[dict[str, Any]], int],
) -> None:
    from tqdm import tqdm

    out: Path = args.out
    prompts = build_prompts(setup.tokenizer)
    levels = levels_for(args)
    if args.profile:
        profiled_level(levels, args.profile_level)  # a --profile-level the run does not measure: refused now
    paths = measured_paths(args)
    total = sum(level["requests"] * reps_of(level) for level in levels) * len(paths)
    progress = tqdm(total=total, unit="req", desc="bench", file=sys.stderr)

    sliced = SlicedLevels()
    gpu_clocks = GpuClockSampler()
    cpu_busy = CpuBusySampler() if args.cpu_busy else None

    async def record(path: str, rep: int, level: dict[str, Any], measured: dict[str, Any]) -> None:
        span = measured.pop("span")
        if cpu_busy is not None:  # not with slices (refused): each slice is its own stretch of time
            measured["cpu_busy"] = summarize_cpu_busy(cpu_busy.take(*span), setup.engine_cpus)
        # waits for the window's last samples (GpuClockSampler.between): in a thread, the loop left free meanwhile
        measured["gpu_samples"] = await asyncio.to_thread(gpu_clocks.between, *span)
        whole = sliced.complete(path, rep, level, measured)
        if whole is None:  # a slice of a level whose path has slices to come
            return
        # The engine's own clients count each request's tokens (a served path's were checked when it opened)
        requests = level.get("level_requests", level["requests"])
        if whole["output_tokens"] != requests * level["max_tokens"]:
            counted = f"{whole['output_tokens']} tokens over {requests} requests"
            raise RuntimeError(f"token check: {path} generated {counted} with max_tokens {level['max_tokens']}")
        whole["gpu_clocks"] = summarize_gpu_clocks(whole.pop("gpu_samples"))
        on_result(
            LevelResult(
                path,
                level["max_tokens"],
                level["concurrency"],
                rep,
                level.get("level_requests", level["requests"]),
                stagger_seconds=level["stagger"],
                background_load=load.running,
                turn_index=turn.index(path) if turn else None,
                slices=level.get("slices", 1),
                **whole,
            )
        )

    bare, shared, served, triton = engine_groups(paths)
    groups: list[Group] = []
    if bare:
        spec = {
            "engine_args": setup.engine_args,
            "engine_cpus": setup.engine_cpus,
            "prompts": [prompt.ids for prompt in prompts],
            "profile": args.profile,
            "delay": args.bare_delay_ms / 1000,  # the bare-delayed path's longest hold
        }
        groups.append(BareGroup(args, bare, levels, spec, out / "bare.log"))
    if shared:
        groups.append(FrontEndsGroup(args, shared, levels, prompts, setup))
    if served:
        groups.append(VllmServeGroup(args, served, levels, prompts, setup))
    if triton:
        groups.append(TritonGroup(args, triton, levels, prompts, setup))
    turn = interleaved_turn(groups) if args.interleave else []
    opened: list[Group] = []

    async def launch(group: Group) -> None:
        opened.append(group)  # closed on the way out: its process runs from here on
        await group.launch()

    async def start(group: Group) -> None:
        progress.set_description(f"starting {', '.join(group.paths)}")
        if group not in opened:  # closed on the way out even if it fails midway through opening (a failed token check)
            opened.append(group)
        await group.open()

    gpu_clocks.start()
    if cpu_busy is not None:
        cpu_busy.start()
    try:
        if args.interleave:  # every engine up before the first level
            await start_groups(groups, launch, start, args.parallel_starts)
        for group, path, rep, level in schedule(
            groups, levels, args.interleave, reps_of, done, args.one_stream_slices, args.wave_slices
        ):
            if group not in opened:  # one group at a time: the one before is done
                while opened:
                    await opened.pop().close()
                await start(group)
            progress.set_description(f"{path} (rep {rep + 1})")
            if args.background_load_alternate:
                load.run(rep % 2 == 1)
            await record(path, rep, level, await group.measure(path, rep, level, progress))
    finally:
        try:
            await close_all(group.close for group in reversed(opened))
        finally:
            gpu_clocks.stop()
            if cpu_busy is not None:
                cpu_busy.stop()
    progress.close()


def report(doc: dict[str, Any], results_path: Path, plot_path: Path) -> None:
    """Print a run's table, its targets and the machine's spread (and each command's machine), draw its plot."""
    plot(doc["summary"], plot_path)
    print_table(doc["summary"])
    print()
    for line in doc["targets"]:
        print(line)
    if doc["noise"]:
        print("\nthe machine's own spread of a paired ratio (the same engine's two paths, seconds apart):")
        for line in doc["noise"]:
            print(line)
    if doc["background_load"]:
        print("\n--background-load-alternate, each path's loaded repetition over its unloaded one before it:")
        for line in doc["background_load"]:
            print(line)
    gpu_lines = describe_gpu_clocks(doc["runs"])
    if gpu_lines:
        print("\n" + "\n".join(gpu_lines))
    for index, command in enumerate(doc.get("commands", [])):
        lines = describe_machine(command)
        if lines:
            print(f"\ncommand {index} ran on: " + "\n".join(lines))
    print(f"\nresults: {results_path}  plot: {plot_path}")


def report_only(out: Path) -> int:
    """--report: OUT/results.json as this bench judges it now (a run merged over commands and machines, or one made
    by an older bench), without measuring anything."""
    path = out / "results.json"
    if not path.exists():
        raise SystemExit(f"bench: --report: no {path}")
    commands = json.loads(path.read_text()).get("commands", [])
    runs = load_runs(path)
    report({**judged(runs), "commands": commands, "runs": [asdict(run) for run in runs]}, path, out / "bench.png")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line (also how tools/pair_spread.py reads the commands recorded in a results file)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", type=Path, help="the deployment file to render and measure")
    parser.add_argument(
        "--set", action="append", default=[], type=set_argument, metavar="NAME=VALUE", help="${NAME} in the file"
    )
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64, 256])
    parser.add_argument("--max-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    parser.add_argument("--reps", type=int, default=3, help="repetitions of every level, inside one engine start")
    parser.add_argument(
        "--fill-to",
        type=int,
        metavar="N",
        help="with --merge, instead of --reps: each level gets the repetitions it lacks for N of every path in"
        " OUT/results.json (a run that a time limit stopped, completed by the next command; none where it has N)",
    )
    parser.add_argument(
        "--paths",
        type=path_list,
        default=["bare", "vllm-serve", "plain-grpc", "plain-http", "stream-grpc"],
    )
    parser.add_argument(
        "--also-deployment",
        action="append",
        default=[],
        type=Path,
        help="another deployment file rendered into the same server (its own model names); measure its models with"
        " --extra-model / --extra-stream-model",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        nargs="+",
        metavar="ARG",
        help="PREFIX KEY=VALUE ...: a variant of --deployment rendered into the same server: its model names"
        " prefixed with PREFIX, each dotted KEY set to the YAML VALUE (e.g. --variant u_ 'core.engine_cpus=[]');"
        " measure its models with --extra-model PREFIXvllm_model / --extra-stream-model PREFIXvllm_model_stream",
    )
    parser.add_argument(
        "--preprocess-model-stream",
        metavar="NAME",
        help="with core.preprocess_threads: also the streaming ensemble through the preprocess model to the same core,"
        " as model NAME (path extra-stream:NAME)",
    )
    parser.add_argument(
        "--entry-plain",
        metavar="NAME",
        help="with entry: ensemble or plain-core, also the plain path as entry: plain-bls serves it (the stages"
        " in-process, the same core by BLS), as model NAME (path extra:NAME)",
    )
    parser.add_argument("--extra-model", action="append", default=[])
    parser.add_argument("--extra-stream-model", action="append", default=[])
    parser.add_argument("--vllm-backend", type=Path, help="src/ of a triton-inference-server/vllm_backend checkout")
    parser.add_argument("--merge", action="store_true", help="add this run to OUT/results.json instead of replacing")
    parser.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: print OUT/results.json's table and targets and draw its plot",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="start every engine first, then measure each level on every path in turn (paired repetitions)",
    )
    parser.add_argument(
        "--parallel-starts",
        action="store_true",
        help="with --interleave: start the engines after the first one together (~1 min less per run on an H100,"
        " where `vllm serve` and tritonserver each took ~60 s); for deployments that fix their KV cache's size"
        " (kv_cache_memory_bytes), as vLLM's memory profiling at start-up misreads another engine's allocations",
    )
    parser.add_argument(
        "--one-stream-slices",
        type=int,
        default=1,
        metavar="N",
        help="with --interleave: measure each one-stream level in N slices of its requests, the turn of the paths once"
        " per slice (reversed every other slice); each path's slices add up to its repetition, so the paths compared"
        " at one stream are measured within a second or two of each other, not 4-15 s apart (1: the whole level at"
        " once); only a path's first slice warms up, so N as large as the level's requests costs no more time",
    )
    parser.add_argument(
        "--wave-slices",
        type=int,
        default=1,
        metavar="N",
        help="with --interleave: measure each level of several streams in N slices of whole waves (its streams'"
        " requests shared out), the turn of the paths once per slice (reversed every other slice); each path's slices"
        " add up to its repetition, so the paths compared take turns every few waves instead of every level and the"
        " machine's slow spells of a few seconds fall on both (1: each level whole)",
    )
    parser.add_argument(
        "--bare-delay-ms",
        type=float,
        default=BARE_DELAY_MS,
        metavar="MS",
        help="the bare-delayed path holds each request back a random 0 to MS ms before the engine gets it",
    )
    parser.add_argument("--profile", action="store_true", help="per-process CPU, Triton stats, py-spy profiles")
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="with --profile: py-spy samples only the thread holding each interpreter's GIL (its Python time)",
    )
    parser.add_argument(
        "--cpu-busy",
        action="store_true",
        help="how many CPUs were busy at once in each measurement, from /proc/stat every 20 ms (tools/cpu_busy.py)",
    )
    parser.add_argument(
        "--profile-level",
        type=profile_level_argument,
        metavar="STREAMSxTOKENS",
        help="the level py-spy records, e.g. 64x64 (default: the largest)",
    )
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests per level")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help="requests per level are --requests-per-stream x concurrency, at least --min-requests and at most this"
        " many (before --quick)",
    )
    parser.add_argument(
        "--min-requests",
        type=int,
        default=DEFAULT_MIN_REQUESTS,
        help="requests per level at least (before --quick): the first tokens a one-stream level's TTFT p50 comes from",
    )
    parser.add_argument(
        "--requests-per-stream",
        type=int,
        default=DEFAULT_REQUESTS_PER_STREAM,
        help="each stream's requests per level (waves of requests: more make a level longer and its ratio steadier)",
    )
    parser.add_argument(
        "--stagger-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="start each level's streams evenly spread over S seconds instead of all at once (0): the streams then"
        " run out of step, as steady traffic arrives, not in waves of requests that start and end together",
    )
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread each level's streams over this many client processes (not the bare paths)",
    )
    parser.add_argument(
        "--background-load",
        type=int,
        default=0,
        metavar="N",
        help="keep N CPUs busy with pure-Python loops for the whole run (how the engine steps on a busy host)",
    )
    parser.add_argument(
        "--background-load-kind",
        choices=sorted(BACKGROUND_LOADS),
        default="spin",
        help="what the --background-load processes do: spin (a CPU), memory (a CPU, memory bandwidth and cache), "
        "objects (a CPU and Python allocation churn)",
    )
    parser.add_argument(
        "--background-load-alternate",
        action="store_true",
        help="run the --background-load processes in odd repetitions only (paused in even ones): each path's "
        "repetitions 2k and 2k+1 are its unloaded and loaded pair",
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".bench")
    parser.add_argument("--bare-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--front-ends-launcher", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.bare_worker:
        bare_worker_main(args.bare_worker)
        return 0
    if args.front_ends_launcher:
        front_ends_launcher(json.loads(args.front_ends_launcher.read_text()), *worker_streams())
        return 0
    if args.report:
        return report_only(args.out)
    if args.fill_to is not None and not args.merge:
        parser.error("--fill-to counts the repetitions in OUT/results.json: it needs --merge")
    if args.parallel_starts and not args.interleave:
        parser.error("--parallel-starts starts every engine before the first level: it needs --interleave")
    for option, slices in (("--one-stream-slices", args.one_stream_slices), ("--wave-slices", args.wave_slices)):
        if slices < 1:
            parser.error(f"{option} must be 1 or more")
        if slices > 1 and (not args.interleave or args.profile):
            parser.error(f"{option} takes the turn of --interleave, and --profile's readings are per level")
        if args.cpu_busy and slices > 1:
            parser.error(f"--cpu-busy reads one stretch of time per measurement: not with {option}")
    if args.wave_slices > 1 and args.stagger_seconds > 0:
        parser.error("--wave-slices slices waves: with --stagger-seconds the streams run out of step")
    if args.profile_gil and not args.profile:
        parser.error("--profile-gil chooses how --profile's py-spy samples: it needs --profile")
    args.variables = dict(args.set)

    results = ResultsFile(
        args.out / "results.json",
        merge=args.merge,
        command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        deployment=str(args.deployment or "deployments/default.yaml + BENCH_ENGINE_OVERRIDES"),
        paths=measured_paths(args),
        stagger_seconds=args.stagger_seconds,
        bare_delay_ms=args.bare_delay_ms,
    )
    reps_of = repetitions_of(args, results)
    if not any(reps_of(level) for level in levels_for(args)):
        print("bench: every level has as many repetitions already (--fill-to); nothing measured")
        return 0
    stopped: BaseException | None = None
    # Before any group opens (the bare worker and `vllm serve` start before a Triton server would install it): a run
    # stopped by `timeout` closes every group on the way out instead of leaving them running.
    interrupt_on_sigterm()
    try:
        asyncio.run(run_all(args, results.add, results.repetitions_done, reps_of))
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the groups are closed by now
        stopped = exc
    except Exception as exc:  # noqa: BLE001 - a server that died mid-run: keep and show what was measured
        stopped = exc
        traceback.print_exc()
    # Written after each level already; a run that measured nothing leaves an earlier file as it was.
    report(results.document(), results.path, args.out / "bench.png")
    if stopped is not None:
        reason = "interrupted" if isinstance(stopped, KeyboardInterrupt) else f"{type(stopped).__name__}: {stopped}"
        print(f"bench: stopped early ({reason}); the table holds what was measured")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
