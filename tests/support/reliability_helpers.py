"""Helpers for the reliability tests: a private server on a repository rendered to a tmp dir, /metrics parsing."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import yaml

import repo_render
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
