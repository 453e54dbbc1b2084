"""Serve several rendered deployments from one repository, so one tritonserver start covers them all; a
deployment with its own stage code in a folder outside the project (`code_paths`)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from repo_render import Deployment, Names, write
from repo_render import render_together as render_files
from tools.triton_server import TritonServer, start_on_free_ports


def with_own_internal_names(deployment: Deployment) -> Deployment:
    """Internal model names derived from the public plain name, so deployments can share a repository."""
    names = deployment.names
    internal = {key: f"{names.plain}_{key}" for key in Names.model_fields if key not in ("plain", "streaming")}
    return deployment.model_copy(update={"names": names.model_copy(update=internal)})  # keeps base_dir


def render_together(deployments: list[Deployment], out: Path) -> dict[str, str]:
    """repo_render.render_together, written to `out`."""
    files = render_files(deployments, out)
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


# A package, not one file: the stage imports a sibling module only when it runs, so the folder must stay on the
# stub's sys.path after the class was loaded.
OWN_CODE = {
    "shouting/__init__.py": "",
    "shouting/style.py": """
        def shout(text: str) -> str:
            return text.upper()
    """,
    "shouting/stage.py": """
        import numpy as np

        from postprocess.vllm_backend import VllmBackendPostprocessor


        class Shout(VllmBackendPostprocessor):
            def __init__(self, settings):
                super().__init__(settings)
                self.prefix = settings.get("prefix", "")

            def process(self, inputs, parameters):
                from shouting.style import shout

                out = super().process(inputs, parameters)
                texts = [self.prefix + shout(bytes(t).decode()) for t in out["text_output"]]
                out["text_output"] = np.array([t.encode() for t in texts], dtype=np.object_)
                return out


        class Broken(VllmBackendPostprocessor):
            def __init__(self, settings):
                raise RuntimeError("the shouting table is missing")
    """,
}


def write_own_code(folder: Path) -> Path:
    for rel, text in OWN_CODE.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(textwrap.dedent(text).lstrip())
    return folder


def own_deployment(folder: Path, model: Path | str, stage: str = "Shout", **top: str) -> Path:
    """deploy/deployment.yaml next to own_code/ (code_paths relative to the config file)."""
    write_own_code(folder / "own_code")
    (folder / "deploy").mkdir(exist_ok=True)
    lines = [
        f"model: {model}",
        "engine_args: {enforce_eager: true, max_model_len: 512, kv_cache_memory_bytes: 268435456,"
        " gpu_memory_utilization: 0.05, disable_log_stats: true}",  # 0.05: engines share a GPU in the suite
        "engine_env: {OMP_NUM_THREADS: '1', VLLM_ENABLE_V1_MULTIPROCESSING: '0'}",
        "code_paths: [../own_code]",
        f"postprocess: {{class: 'shouting.stage:{stage}', settings: {{prefix: '[own] '}}}}",
        *(f"{key}: {value}" for key, value in top.items()),
    ]
    config = folder / "deploy" / "deployment.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config
