"""Helpers for the reliability tests: a private server on a repository rendered to a tmp dir, /metrics parsing."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

import repo_render
from repo_render.schema import Names
from tests.support.triton_helpers import process_group_members
from tools.triton_server import TritonServer, start_on_free_ports

ROOT = Path(__file__).resolve().parents[2]


def render_repository(out: Path, *, entry: str = "bls", **overrides: object) -> Path:
    """Render the default deployment (with `entry` and top-level overrides, e.g. metrics=True) into `out`."""
    doc = yaml.safe_load(repo_render.DEFAULT_CONFIG.read_text())
    doc.update({"entry": entry, **overrides})
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(doc))
    deployment = repo_render.load_deployment(config)
    deployment.base_dir = repo_render.DEFAULT_CONFIG.parent  # the model path stays relative to deployments/
    files = repo_render.render(deployment, out)
    repo_render.write(files, out)
    return out


def default_engine_args(**changes: object) -> dict:
    """The default deployment's engine_args with `changes`, e.g. max_model_len=2048 (the tiny model's longest) for
    requests that run for seconds."""
    return {**yaml.safe_load(repo_render.DEFAULT_CONFIG.read_text())["engine_args"], **changes}


CORE_MODEL = Names().core  # the default deployment's core model


def engine_cores(server: TritonServer) -> list[int]:
    """The process ids of the server's vLLM EngineCore processes."""
    # comm is cut to 15 chars: VLLM::EngineCor
    return [pid for pid, comm in process_group_members(server.process.pid).items() if "EngineCor" in comm]


def core_requests(server: TritonServer) -> int:
    """Requests that Triton counted at the core's execute so far (a decoupled model's execute only starts them)."""
    return int(server.model_stats(CORE_MODEL)[CORE_MODEL]["inference_count"])


def wait_for_core_requests(server: TritonServer, count: int, timeout: float) -> int:
    """Poll until Triton counted `count` requests at the core (or `timeout` s passed); the count it reached."""
    deadline = time.monotonic() + timeout
    while (counted := core_requests(server)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return counted


@contextlib.contextmanager
def engine_stopped(pid: int) -> Iterator[None]:
    """The EngineCore `pid` stopped (SIGSTOP) inside the block, continued after it: requests sent meanwhile reach the
    core but cannot finish. On the CI machine a test cannot time an action against requests that decode (while they
    run, its timed waits wake only as they end), so the tests that act on requests in flight stop the engine first."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed inside the block
            os.kill(pid, signal.SIGCONT)


_UUID_NAME = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def vllm_ipc_sockets(folder: Path | None = None) -> set[Path]:
    """The Unix socket files in `folder` (the system's temporary folder by default) named as vLLM names its ZMQ ipc
    endpoints (a uuid4 under VLLM_RPC_BASE_PATH)."""
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    return {path for path in folder.iterdir() if _UUID_NAME.fullmatch(path.name) and path.is_socket()}


def start_server(repository: Path, log: Path, exit_timeout_secs: int = 10) -> TritonServer:
    return start_on_free_ports(repository, log, exit_timeout_secs=exit_timeout_secs)


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def scrape(server: TritonServer) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics: (name, frozenset of label pairs) -> value."""
    with urllib.request.urlopen(f"http://{server.address}:{server.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def vllm_metric(samples: dict, name: str, model: str = "vllm_core", **labels: str) -> float | None:
    wanted = {("model", model), ("version", "1"), *labels.items()}
    for (sample_name, sample_labels), value in samples.items():
        if sample_name == name and wanted <= sample_labels:
            return value
    return None
