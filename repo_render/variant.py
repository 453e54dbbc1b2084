"""A deployment's variant for the same server: every model name prefixed, some keys set (tools/bench.py --variant).

Two deployments rendered into one repository must not share a model name (repository.render_together); with its
names prefixed, a variant (another instance count, another CPU placement) is served beside the deployment it comes
from, so the two are measured level by level in one server. The keys are set in the YAML before it is parsed, so the
variant is checked by the same schema and rules as any deployment file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from repo_render.checks import deployment_from_doc, read_deployment_doc
from repo_render.schema import ConfigError, Deployment, Names
from repo_render.substitute import set_argument


def setting(text: str) -> tuple[str, Any]:
    """`KEY=VALUE`: a dotted key of the deployment file and a YAML value (`core.engine_cpus=[15]`), split as
    `--set NAME=VALUE` is."""
    try:
        key, value = set_argument(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"{exc}, e.g. generate.instances=12") from None
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{key}: the value {value!r} is not YAML: {exc}") from exc


def set_key(doc: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key in a deployment file's YAML, making the sections it names where they are missing."""
    *sections, last = key.split(".")
    node = doc
    for depth, section in enumerate(sections):
        child = node.setdefault(section, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {'.'.join(sections[: depth + 1])} is not a section")
        node = child
    node[last] = value


def load_variant(
    path: Path, prefix: str, settings: list[tuple[str, Any]], variables: dict[str, str] | None = None
) -> Deployment:
    """The deployment file at `path` with every model name (its `names`, defaults included) prefixed by `prefix`
    and each (dotted key, value) of `settings` set."""
    doc = read_deployment_doc(path, variables)
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a deployment (a YAML mapping)")
    names = {**Names().model_dump(), **(doc.get("names") or {})}
    doc["names"] = {role: prefix + name for role, name in names.items()}
    for key, value in settings:
        if key == "names" or key.startswith("names."):
            raise ConfigError(f"{key}: a variant's names are the deployment's with its prefix ({prefix!r})")
        set_key(doc, key, value)
    return deployment_from_doc(doc, path)
