"""Serve several rendered deployments from one repository, so one tritonserver start covers them all."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from tools.render_repo import Deployment, Names, render, write
from tools.triton_server import TritonServer, start_on_free_ports


def with_own_internal_names(deployment: Deployment) -> Deployment:
    """Internal model names derived from the public plain name, so deployments can share a repository."""
    names = deployment.names
    internal = {f.name: f"{names.plain}_{f.name}" for f in fields(Names) if f.name not in ("plain", "streaming")}
    return replace(deployment, names=replace(names, **internal))


def render_together(deployments: list[Deployment], out: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for deployment in deployments:
        rendered = render(deployment, out)
        overlap = set(rendered) & set(files)
        assert not overlap, f"deployments share model folders: {sorted(overlap)[:3]}"
        files.update(rendered)
    write(files, out)
    return files


def start_server(repository: Path, log: Path, timeout: float = 900) -> TritonServer:
    try:
        return start_on_free_ports(
            repository,
            log,
            timeout,
            exit_timeout_secs=10,
            # One model at a time: with three vLLM engines starting at once in one server, one engine's start-up
            # hung (seen once, after its EngineCore had started; cause not found). Serial loads avoid the overlap.
            extra_args=["--model-load-thread-count=1"],
        )
    except Exception as exc:
        errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("E")]
        raise RuntimeError(f"{exc}; the log's errors:\n" + "\n".join(errors[-20:])) from exc
