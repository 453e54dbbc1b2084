"""Start and stop the real `tritonserver` (Triton 2.51 from the nvidia-pytriton wheel) on this repository.

Used by `tools/serve.py` and by the test suite. The server runs in its own process group, so stopping it also
stops every Python-backend stub and vLLM's EngineCore process; each server gets its own shared-memory prefix
(Python-backend regions and multiprocessing semaphores) and its own temporary folder (TMPDIR: vLLM's ZMQ
sockets and `vllm_dist_*` files), so what its processes leave is removed at stop without touching another
server's.
"""

from __future__ import annotations

import contextlib
import getpass
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from core.interface import ENGINE_REQUEST, ENGINE_RESPONSE  # plain Python: importing them starts no vLLM
from core.process_names import SEM_PREFIX_ENV

ROOT = Path(__file__).resolve().parent.parent
# The Python backend's thread-pool-size (default 32) caps the BLS calls in flight in a stub: measured on 2.51,
# the plain path never had more than 32 requests in the engine, at any client concurrency. A stub of generate (or of
# an entry model) has up to its generate.max_in_flight (512 by default) in flight, so the launcher passes the
# repository's largest (python_backend_threads); pass at least that to a tritonserver you start yourself. The pool
# is started for every Python model instance (docs/platform-notes.md T10): no larger than needed.
PYTHON_BACKEND_DEFAULT_THREADS = 32
# The key of generate's and the entry models' settings.json (core/settings.py, GenerateSettings)
_MAX_IN_FLIGHT = "max_in_flight"


def python_backend_threads(repository: Path) -> int:
    """thread-pool-size for a rendered repository: the most BLS worker threads any of its models has
    (generate.max_in_flight, in the settings.json of generate and of the entry models), at least the default."""
    most = PYTHON_BACKEND_DEFAULT_THREADS
    for path in sorted(Path(repository).glob("*/*/settings.json")):
        try:
            value = json.loads(path.read_text()).get(_MAX_IN_FLIGHT)
        except (OSError, ValueError, AttributeError):  # not ours to judge here: the model's load says what is wrong
            continue
        if isinstance(value, int):
            most = max(most, value)
    return most


# Triton 2.51's log lines for a model that did not load, with the stub's Python error and its "At:" frames as
# \n-escaped text inside the quoted message:
#   E... model_lifecycle.cc:642] "failed to load 'postprocess' version 1: Internal: ValueError: ...\n\nAt:\n  ..."
#   E... model_repository_manager.cc:703] "Invalid argument: ensemble 'm' depends on 'postprocess' which has no ..."
_FAILED_TO_LOAD = re.compile(r"""failed to load '(?P<model>[^']+)' version \S+: (?P<error>.*?)"?$""")
_DEPENDS_ON = re.compile(r"""ensemble '(?P<model>[^']+)' depends on '(?P<other>[^']+)' which has no loaded version""")


@dataclass
class LoadFailure:
    model: str
    lines: list[str]  # the error, then the Python traceback's lines when the stub gave one


def load_failures(log_text: str) -> list[LoadFailure]:
    """The models a server log says failed to load, each once, in the log's order; ensembles that failed only
    because a step did not load name that step."""
    failures: dict[str, LoadFailure] = {}
    for line in log_text.splitlines():
        if (found := _FAILED_TO_LOAD.search(line)) and found["model"] not in failures:
            text = found["error"].replace("\\n", "\n").replace('\\"', '"')
            lines = [part.rstrip() for part in text.split("\n") if part.strip()]
            failures[found["model"]] = LoadFailure(found["model"], lines)
        elif (found := _DEPENDS_ON.search(line)) and found["model"] not in failures:
            failures[found["model"]] = LoadFailure(found["model"], [f"not loaded: its step {found['other']!r} failed"])
    return list(failures.values())


def format_failures(failures: list[LoadFailure]) -> str:
    out = []
    for failure in failures:
        out.append(f"  model '{failure.model}': {failure.lines[0]}")
        out.extend(f"      {line}" for line in failure.lines[1:])
    return "\n".join(out)


# A process of the server could not start a thread: the host's thread limit was reached. tritonserver itself starts
# thread-pool-size threads for every Python model instance (measured on 2.51: 3114 threads for the default
# repository's 6 instances at 512), and died during load with SIGSEGV when two 28-instance deployments shared one
# server on the H100 host (docs/deployments.md, docs/platform-notes.md T10).
_OUT_OF_THREADS = re.compile(r"pthread_create failed|can't start new thread")


def python_instance_counts(repository: Path) -> dict[str, int]:
    """Each Python-backend model of a repository, by name, with the instances its config asks for."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    counts = {}
    for path in sorted(Path(repository).glob("*/config.pbtxt")):
        try:
            config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        except (OSError, text_format.ParseError):  # not ours to judge here: Triton's log says what is wrong with it
            continue
        if config.backend == "python":
            counts[config.name or path.parent.name] = sum(group.count or 1 for group in config.instance_group) or 1
    return counts


def python_instances(repository: Path) -> int:
    """How many Python-backend model instances a repository's configs ask for."""
    return sum(python_instance_counts(repository).values())


# Triton's Python backend unloads a model's instances one after another, and each instance's teardown starts with a
# fixed one-second probe of its stub's health (python_backend's StubLauncher::UpdateHealth sleeps 1 s): a model of N
# instances takes N seconds or more to unload, while models unload side by side (docs/platform-notes.md T11). On the
# H100 host the benchmark deployment's 8 postprocess instances took 11.3 s, and its 12 preprocess instances were still
# loaded when a 15 s exit timeout ran out ("failed to stop server: ... Exit timeout expired").
DEFAULT_EXIT_TIMEOUT_SECONDS = 15
UNLOAD_SECONDS_PER_INSTANCE = 1.5
UNLOAD_MARGIN_SECONDS = 5


def exit_timeout_for(repository: Path) -> int:
    """tritonserver's --exit-timeout-secs for a repository: 15 s, or longer where its largest Python model needs
    that long to unload instance by instance."""
    largest = max(python_instance_counts(repository).values(), default=0)
    unload = math.ceil(UNLOAD_SECONDS_PER_INSTANCE * largest) + UNLOAD_MARGIN_SECONDS
    return max(DEFAULT_EXIT_TIMEOUT_SECONDS, unload)


def out_of_threads(log_text: str, repository: Path) -> str | None:
    """Why the server died, when its log says a thread could not be started; None otherwise."""
    if not _OUT_OF_THREADS.search(log_text):
        return None
    instances, pool = python_instances(repository), python_backend_threads(repository)
    return (
        "the host ran out of threads (the log says a thread could not be started): tritonserver starts"
        f" thread-pool-size ({pool}) threads for every Python model instance, and this repository has {instances}"
        f" (about {instances * pool} threads). Lower the deployment's instance counts or generate.max_in_flight"
        " (the pool's size), or raise the host's limit (/proc/sys/kernel/threads-max, pid_max, the container's"
        " pids.max)"
    )


class OutOfThreadsError(RuntimeError):
    """tritonserver died because the host ran out of threads: starting it again would fail the same way."""


class ModelLoadError(RuntimeError):
    """tritonserver stopped because models failed to load: starting it again would fail the same way."""

    def __init__(self, message: str, failures: list[LoadFailure]) -> None:
        super().__init__(message)
        self.failures = failures


def pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")  # not imported: PyTriton's own API is not installed
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nvidia-pytriton is not installed; run tools/setup_env.sh")
    return Path(spec.submodule_search_locations[0]) / "tritonserver"


def server_environment(tmp_dir: Path | None = None, sem_prefix: str | None = None) -> dict[str, str]:
    """The environment the server and its stubs need: venv python first on PATH, libpython.

    `tmp_dir`: the server tree's TMPDIR, where vLLM puts its ZMQ ipc sockets (VLLM_RPC_BASE_PATH defaults to
    tempfile.gettempdir(), set here too in case it was read earlier) and its `vllm_dist_*` files; Triton and its
    stubs use it like any temporary folder. torch's compile cache stays where it was: it outlives servers.
    `sem_prefix`: the name prefix of the tree's multiprocessing semaphores in /dev/shm.
    """
    env = dict(os.environ)
    if tmp_dir is not None:
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))
        env["TMPDIR"] = env["VLLM_RPC_BASE_PATH"] = str(tmp_dir)
    if sem_prefix is not None:
        env[SEM_PREFIX_ENV] = sem_prefix
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The project's packages (core, preprocess, postprocess) must import inside the stubs even without an
    # editable install.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def inductor_cache_dir() -> Path:
    """torch's default compile cache folder (torch._inductor.runtime.cache_dir_utils), under today's TMPDIR:
    a process given a private TMPDIR keeps using it (and vLLM on CPU compiles kernels there)."""
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):
        user = "unknown"
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


@contextlib.contextmanager
def private_tmp_dir(prefix: str) -> Iterator[Path]:
    """This process (and what it starts) with a TMPDIR of its own inside the block, removed at its end: vLLM names
    its ZMQ ipc sockets there (VLLM_RPC_BASE_PATH, set too in case it was read before) and its `vllm_dist_*` files,
    and leaves them behind when its engine shuts down. torch's compile cache keeps its usual folder. The
    environment and tempfile's cached folder are as they were after the block."""
    saved = {key: os.environ.get(key) for key in ("TMPDIR", "VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR")}
    saved_tempdir = tempfile.tempdir
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))
    private = Path(tempfile.mkdtemp(prefix=prefix))  # short: socket paths must stay under 108 bytes
    os.environ["TMPDIR"] = os.environ["VLLM_RPC_BASE_PATH"] = str(private)
    tempfile.tempdir = str(private)  # gettempdir() may have been cached already
    try:
        yield private
    finally:
        tempfile.tempdir = saved_tempdir
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(private, ignore_errors=True)


# Where free_ports() looks: from here up to the kernel's ephemeral range
LISTEN_PORTS_FROM = 10000
EPHEMERAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports_start() -> int:
    """Where the kernel's range for automatic local ports (an outgoing connection's, a bind to port 0) starts."""
    try:
        return int(EPHEMERAL_PORT_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports below the kernel's ephemeral range (held open together while picked, so they differ).

    Not a bind to port 0: that picks from the ephemeral range, where any outgoing connection of the machine (vLLM's
    and torch's during a server's minute of model loading) can take the port before tritonserver binds it; in CI a
    server went down that way after it was ready ("failed to start Metrics service: ... already in use").
    """
    candidates = range(LISTEN_PORTS_FROM, ephemeral_ports_start())
    sockets: list[socket.socket] = []
    tries = 0
    try:
        while len(sockets) < count:
            tries += 1
            if tries > 100 * count:
                raise OSError(f"no {count} free ports found in {candidates.start}-{candidates.stop - 1}")
            s = socket.socket()
            try:
                # A range too narrow to pick from at random (an unusual kernel setting): the kernel's own pick
                s.bind(("127.0.0.1", random.choice(candidates) if len(candidates) >= 1000 else 0))
            except OSError:  # in use: another one
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch_on_free_ports(repository: Path, log_file: Path, **options: Any) -> TritonServer:
    """A server started on free ports and not waited for (several servers boot at once, tools/bench.py
    --parallel-starts): start_on_free_ports(..., launched=it) waits for it."""
    server = TritonServer(repository, log_file=log_file, **options)
    server.use_free_ports()
    server.start()
    return server


def start_on_free_ports(
    repository: Path, log_file: Path, timeout: float = 600.0, launched: TritonServer | None = None, **options: Any
) -> TritonServer:
    """A ready server on free ports (HTTP, gRPC, metrics); `options` go to TritonServer. `launched`: a server
    launch_on_free_ports started, to wait for instead of a new one.

    A server that exits before it is ready is started once more, on new ports: a free port can be taken by
    another process before tritonserver binds it ("Socket ... already in use", seen in a probe run).
    """
    server = launched or TritonServer(repository, log_file=log_file, **options)
    try:
        server.start_and_wait(timeout, new_ports=True, launched=launched is not None)
    except BaseException:
        server.stop()
        raise
    return server


def interrupt_on_sigterm() -> None:
    """Take SIGTERM as Ctrl-C in this process, unless it already has a handler of its own.

    A server runs in a session of its own (so that stopping it stops its stubs and engines), so a signal meant for
    its caller does not reach it. SIGTERM, which `timeout`, job schedulers and `docker stop` send, ends a Python
    process without running its `finally` blocks: the caller's servers lived on (on the H100 an orphaned benchmark
    server with ~14,000 threads made the next run fail, docs/performance-gpu.md). As a KeyboardInterrupt it unwinds
    through the `finally` blocks and context managers that stop them. Only the main thread may set a handler.

    Only the first SIGTERM interrupts: GNU `timeout` sends it twice (to the command, then to its process group), and
    a second KeyboardInterrupt raised while the first unwinds cut the benchmark's closing of its servers short on the
    H200 (docs/performance-gpu.md, session 60). Later ones are let go, not ignored (SIG_IGN would pass on to the
    processes started after it).
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt_once)


def _interrupt_once(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, _let_go)
    signal.default_int_handler(signum, frame)


def _let_go(signum: int, frame: Any) -> None:
    """A SIGTERM after the first: the stop it asks for is already under way."""


# Inputs and outputs only the internal models of a rendered repository have (core/interface.py)
INTERNAL_TENSORS = frozenset((ENGINE_REQUEST.name, ENGINE_RESPONSE.name))


def public_models_of(configs: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Which of these models (Triton's JSON configs by name) a client calls, name -> streaming (decoupled): the
    ensembles, and every other model that no ensemble runs as a step and that neither takes nor gives an engine
    request or response (the Python entry models of entry: bls / plain-bls, the plain core of entry: plain-core)."""

    def decoupled(name: str) -> bool:
        return bool(configs.get(name, {}).get("model_transaction_policy", {}).get("decoupled", False))

    steps = {
        name: [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])]
        for name, config in configs.items()
        if config.get("platform") == "ensemble"
    }
    called = {model for models in steps.values() for model in models}
    public = {}
    for name, config in sorted(configs.items()):
        tensors = {t["name"] for t in [*config.get("input", []), *config.get("output", [])]}
        if name in steps:
            public[name] = any(decoupled(step) for step in steps[name])
        elif name not in called and not tensors & INTERNAL_TENSORS:
            public[name] = decoupled(name)
    return public


class TritonServer:
    def __init__(
        self,
        model_repository: Path,
        *,
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        address: str = "127.0.0.1",
        log_file: Path | None = None,
        exit_timeout_secs: int | None = None,
        extra_args: list[str] | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.http_port, self.grpc_port, self.metrics_port = http_port, grpc_port, metrics_port
        self.address = address
        self.log_file = log_file
        self._exit_timeout_secs = exit_timeout_secs  # None: exit_timeout_for(the repository), read at start
        self.extra_args = list(extra_args or [])
        self.environment = dict(environment or {})  # added to the server's environment (its stubs inherit it)
        self.shm_prefix = f"tvllm{uuid.uuid4().hex[:8]}_"
        self.sem_prefix = f"mp-{self.shm_prefix}"  # /dev/shm/sem.mp-tvllm..._-<random>
        self.tmp_dir: Path | None = None  # created per start, removed at stop
        self.process: subprocess.Popen | None = None
        self._log_handle = None
        # Ensemble requests Triton 2.51 never released (see stop()): model -> count, from the shutdown log
        self.leaked_inflight: dict[str, int] = {}
        self._log_start = 0  # where this start's lines begin in an appended log file
        self._log_in_tmp_dir = log_file is None

    @property
    def exit_timeout_secs(self) -> int:
        if self._exit_timeout_secs is None:  # the repository is rendered by now: this start's command needs it
            self._exit_timeout_secs = exit_timeout_for(self.model_repository)
        return self._exit_timeout_secs

    @property
    def http_url(self) -> str:
        return f"{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"

    def command(self) -> list[str]:
        root = pytriton_root()
        return [
            str(root / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={root / 'backends'}",
            f"--http-address={self.address}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.address}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.address}",
            f"--metrics-port={self.metrics_port}",
            f"--exit-timeout-secs={self.exit_timeout_secs}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            f"--backend-config=python,thread-pool-size={python_backend_threads(self.model_repository)}",
            *self.extra_args,
        ]

    def start(self) -> None:
        interrupt_on_sigterm()  # a caller stopped by SIGTERM still stops this server on its way out
        # Short (Unix socket paths must stay under 108 bytes), under the caller's TMPDIR
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=self.shm_prefix))
        if self._log_in_tmp_dir:  # stop() reads Triton's shutdown messages; a new start, a new folder
            self.log_file = self.tmp_dir / "tritonserver.log"
        self._log_handle = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        self._log_start = self.log_file.stat().st_size
        self.process = subprocess.Popen(
            self.command(),
            env={**server_environment(self.tmp_dir, self.sem_prefix), **self.environment},
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stubs and EngineCore stop with it
        )

    def is_ready(self) -> bool:
        return _answers_ok(f"http://{self.http_url}/v2/health/ready")

    def metrics_answer(self) -> bool:
        return _answers_ok(f"http://{self.address}:{self.metrics_port}/metrics")

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds until ready; raises if the server exits or is not ready in time.

        Ready means its metrics endpoint answers too: tritonserver starts that service after HTTP's and exits when it
        cannot (its port taken), so HTTP's readiness alone can come just before the server goes down.
        """
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                message = f"tritonserver exited with code {code} before it was ready{self._log_hint()}"
                log = self.log_text()
                if (reason := out_of_threads(log, self.model_repository)) is not None:
                    raise OutOfThreadsError(f"{message}: {reason}")
                failures = load_failures(log)
                if failures:
                    raise ModelLoadError(
                        f"{message}; these models failed to load:\n{format_failures(failures)}", failures
                    )
                raise RuntimeError(message)
            if self.is_ready() and self.metrics_answer():
                return time.monotonic() - start
            time.sleep(0.5)
        raise TimeoutError(f"tritonserver not ready after {timeout:.0f} s{self._log_hint()}")

    def use_free_ports(self) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)

    def start_and_wait(
        self, timeout: float = 600.0, attempts: int = 2, new_ports: bool = False, launched: bool = False
    ) -> float:
        """start() + wait_ready(), starting again if the server dies before it is ready.

        Triton 2.51's Python backend can abort at start-up under heavy load (seen here once:
        "terminate called after throwing an instance of 'boost::interprocess::lock_exception'", a known
        intermittent upstream crash). A server that dies before it is ready has served nothing, so one more
        start is safe; the failure is still reported on stderr. A server that stopped because models failed to
        load (ModelLoadError: the log names them), or ran out of threads (OutOfThreadsError), would fail the same way
        again: that is not retried.
        `new_ports`: every start on free ports. `launched`: the first start was already made (only waited for).
        """
        for attempt in range(1, attempts + 1):
            if not (launched and attempt == 1):
                if new_ports:
                    self.use_free_ports()
                self.start()
            try:
                return self.wait_ready(timeout)
            except (ModelLoadError, OutOfThreadsError):
                self.stop()
                raise
            except RuntimeError as exc:  # exited before ready; a TimeoutError is not retried
                self.stop()
                if attempt == attempts:
                    raise
                print(f"tritonserver start {attempt} failed, starting again: {exc}", file=sys.stderr)
        raise AssertionError("unreachable")

    def log_text(self) -> str:
        """This start's part of the log file ("" without one)."""
        if self.log_file is None or not Path(self.log_file).exists():
            return ""
        with open(self.log_file, "rb") as log:
            log.seek(self._log_start)
            return log.read().decode("utf-8", errors="replace")

    def trace_setting(self, **settings: Any) -> dict[str, Any]:
        """Update Triton's trace settings at run time (`/v2/trace/setting`, e.g. trace_level=["TIMESTAMPS"])."""
        return _http_json(f"http://{self.http_url}/v2/trace/setting", json.dumps(settings).encode())

    def model_stats(self, model: str = "") -> dict[str, dict[str, Any]]:
        """Triton's statistics per model name (`/v2/models[/MODEL]/stats`: counts and inference_stats), all models'
        when `model` is empty."""
        path = f"/v2/models/{model}/stats" if model else "/v2/models/stats"
        return {entry["name"]: entry for entry in _http_json(f"http://{self.http_url}{path}").get("model_stats", [])}

    def public_models(self) -> dict[str, bool]:
        """The ready models a client calls, name -> streaming (decoupled): public_models_of the server's own
        configs."""
        index = _http_json(f"http://{self.http_url}/v2/repository/index", body=b"{}")
        return public_models_of(
            {
                m["name"]: _http_json(f"http://{self.http_url}/v2/models/{m['name']}/config")
                for m in index
                if m.get("state") == "READY"
            }
        )

    def _log_hint(self) -> str:
        return f" (log: {self.log_file})" if self.log_file else ""

    def stop(self, grace: float | None = None) -> int | None:
        """SIGINT, wait for Triton's own shutdown, then kill whatever is left of the process group and remove
        what its processes left in /dev/shm and in its temporary folder.

        Triton 2.51 never releases a streaming-ensemble request whose client cancelled while the core still
        generated (README, Reliability): its shutdown then waits the whole exit timeout for requests that
        cannot end, and exits 1 ("Exit timeout expired"). When LEAK_REPORTS of Triton's once-a-second shutdown
        reports in a row name only ensembles, with the same counts, the server is killed at once instead: Triton
        would exit the same way, only later. Fewer reports are not enough: a cancelled plain-ensemble request can
        stay in its ensemble's count for seconds after its last composing step, with no composing model in
        flight (measured on 2.51: up to 4 reports), and then end. The counts are kept in `leaked_inflight`.
        """
        if self.process is None:
            return None
        grace = self.exit_timeout_secs + 15 if grace is None else grace
        pgid = self.process.pid
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            deadline = time.monotonic() + grace
            while self.process.poll() is None and time.monotonic() < deadline:
                leaked = self._only_ensembles_in_flight()
                if leaked:
                    self.leaked_inflight = leaked
                    print(f"tritonserver: stopped at once; Triton never released {leaked}", file=sys.stderr)
                    break
                time.sleep(0.2)
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        _kill_group(pgid)
        self._remove_leftovers()
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        return self.process.returncode

    _INFLIGHT = re.compile(r"Model '([^']+)' \(version \d+\) has (\d+) in-flight inferences")
    _INFLIGHT_ROUND = "model versions that have in-flight inferences"
    LEAK_REPORTS = 6  # lingering cancelled plain-ensemble requests were seen for up to 4 reports

    def _only_ensembles_in_flight(self) -> dict[str, int]:
        """{ensemble: count} when the last LEAK_REPORTS of Triton's shutdown reports name only ensembles, alike."""
        rounds = self.log_text().split(self._INFLIGHT_ROUND)[1:]  # each report: its header, then one line per model
        if len(rounds) <= self.LEAK_REPORTS:  # the last report may still be being written
            return {}
        reports = [dict((m, int(n)) for m, n in self._INFLIGHT.findall(r)) for r in rounds[-self.LEAK_REPORTS - 1 : -1]]
        ensembles = self.ensemble_models()
        if all(report and set(report) <= ensembles and report == reports[0] for report in reports):
            return reports[0]
        return {}

    def ensemble_models(self) -> set[str]:
        """The repository's ensembles (their config.pbtxt says platform "ensemble")."""
        return {
            config.parent.name
            for config in self.model_repository.glob("*/config.pbtxt")
            if re.search(r'^platform:\s*"ensemble"', config.read_text(encoding="utf-8"), re.MULTILINE)
        }

    def _remove_leftovers(self) -> None:
        for prefix in (self.shm_prefix, f"sem.{self.sem_prefix}"):
            for path in Path("/dev/shm").glob(f"{prefix}*"):
                path.unlink(missing_ok=True)
        if self.tmp_dir is not None:
            if self.log_file is not None and self.log_file.parent == self.tmp_dir:
                if self._log_handle is not None:
                    self._log_handle.close()
                    self._log_handle = None
                self.log_file = None
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers_ok(url: str) -> bool:
    """Whether a GET of `url` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def _http_json(url: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def _kill_group(pgid: int) -> None:
    """Stubs or an EngineCore that outlived the server (after a crash) still carry its process group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


class ProcessStat(NamedTuple):
    comm: str  # the kernel's 15-character command name
    state: str
    ppid: int
    pgid: int
    cpu_seconds: float  # user + system
    rss_mib: float


def process_table() -> dict[int, ProcessStat]:
    """Every live process from /proc: the one place the launcher, tests and benchmarks read process groups."""
    tick, page_mib = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE") / 2**20
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ..." - comm may contain spaces, so split after the last ')'
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick
        rss = int(fields[21]) * page_mib
        table[int(entry.name)] = ProcessStat(comm, fields[0], int(fields[1]), int(fields[2]), cpu, rss)
    return table


def children_cpu_seconds() -> float:
    """CPU seconds (user + system, in clock ticks) of this process's live children (an EngineCore it started)."""
    return sum(p.cpu_seconds for p in process_table().values() if p.ppid == os.getpid())
