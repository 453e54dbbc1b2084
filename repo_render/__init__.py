"""Render a whole Triton model repository from one deployment config (the CLI is tools/render_repo.py).

By job: schema (the config's keys and types), substitute (`${NAME}` placeholders), checks (rules across keys,
engine args against vLLM), stages (stage classes and the ensembles' wiring), pbtxt (config.pbtxt), repository
(every file of the repository, writing and comparing it), cli (the command line), variant (a deployment with its
names prefixed and some keys set, to serve beside it: tools/bench.py --variant).
"""

from repo_render.checks import check_deployment, load_deployment
from repo_render.cli import main
from repo_render.repository import drift, existing_files, project_root, render, render_together, write
from repo_render.schema import DEFAULT_CONFIG, DEFAULT_OUT, ROOT, ConfigError, Deployment, Names
from repo_render.stages import check_wiring, load_stage

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_OUT",
    "ROOT",
    "ConfigError",
    "Deployment",
    "Names",
    "check_deployment",
    "check_wiring",
    "drift",
    "existing_files",
    "load_deployment",
    "load_stage",
    "main",
    "project_root",
    "render",
    "render_together",
    "write",
]
