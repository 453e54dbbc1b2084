"""Rules that span keys, and engine_args against vLLM's AsyncEngineArgs; checked before anything is written."""

from __future__ import annotations

import functools
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from core.settings import shared_engine_problem
from repo_render.schema import (
    BUILTIN_STAGES_PATHS,
    STAGE_ROLES,
    ConfigError,
    Deployment,
    did_you_mean,
    parse_deployment,
)
from repo_render.substitute import substitute


@functools.lru_cache(maxsize=1)
def vllm_engine_arg_types() -> dict[str, Any] | None:
    """Field name -> type of vLLM's AsyncEngineArgs (None when vLLM is not installed where the renderer runs)."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
    except ImportError:
        return None
    return {f.name: f.type for f in fields(AsyncEngineArgs)}


def _accepts(hint: Any, value: Any) -> bool | None:
    """Whether a JSON value fits a field type of AsyncEngineArgs; None where this simple check cannot tell."""
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(arg, value) for arg in typing.get_args(hint)]
        return True if True in verdicts else (None if None in verdicts else False)
    return None


def check_deployment(deployment: Deployment) -> None:
    """Rules that span keys or need the file system, checked before anything is written (each key's own type and
    bounds are the schema's, repo_render/schema.py)."""
    names = list(deployment.names.model_dump().values())
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"names: model names must differ, {duplicates} used twice; rename one of them")
    _check_engine_args(deployment)
    if deployment.core.front_ends > 1 and deployment.entry == "bls":
        # An entry model cancels by key; the key lives in the front end that took the request, and the control
        # request could reach another one. (entry: plain-bls watches no cancels.)
        raise ConfigError(
            "core.front_ends > 1 works with entry: ensemble, plain-bls or plain-core only; with entry: bls set it to 1"
        )
    if deployment.entry == "plain-core":
        # The plain model's instances are front ends of the core's engine too: always more than one.
        problem = shared_engine_problem(deployment, deployment.engine_front_ends, "entry: plain-core")
        if problem:
            raise ConfigError(problem)
    if deployment.generate.watch_cancels and deployment.entry != "plain-core":
        # entry: bls watches always; in an ensemble (or a BLS child) Triton 2.51 never shows a cancel to the step
        raise ConfigError(
            f"generate.watch_cancels works with entry: plain-core only (entry: {deployment.entry}); entry: bls"
            " watches cancels always, and a model inside an ensemble never sees one"
        )
    for key, stage in (("postprocess_in_sender", "postprocess"), ("preprocess_threads", "preprocess")):
        if getattr(deployment.core, key) and deployment.entry == "bls":
            # The entry models run the stages themselves; the core's would never be asked for.
            raise ConfigError(
                f"core.{key} does not work with entry: bls (its entry models run {stage} themselves); remove it"
                " or choose entry: ensemble, plain-bls or plain-core (their streaming model is the ensemble)"
            )
    for key in deployment.engine_env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigError(f"engine_env.{key}: not an environment variable name (letters, digits, _)")
    template = deployment.chat_template
    if template is not None:
        if template.inline is not None and template.file is not None:
            raise ConfigError(
                "chat_template: give 'inline' (the template) or 'file' (a path), not both; neither keeps the"
                " model's own template"
            )
        if template.file is not None and not (deployment.base_dir / template.file).is_file():
            raise ConfigError(
                f"chat_template.file: no such file {template.file!r} (relative to the config file's folder)"
            )
    for index, folder in enumerate(deployment.code_paths):
        if not (deployment.base_dir / folder).is_dir():
            raise ConfigError(
                f"code_paths[{index}]: no such folder {folder!r} (relative to the config file's folder, or absolute)"
            )
    own = [role for role in STAGE_ROLES if ":" in getattr(deployment, role).cls]
    if deployment.code_paths and all(getattr(deployment, r).cls in BUILTIN_STAGES_PATHS for r in own):
        raise ConfigError(
            "code_paths: no stage uses a class of its own; set preprocess.class or postprocess.class to"
            " 'module:ClassName' from these folders, or remove code_paths"
        )


def _check_engine_args(deployment: Deployment) -> None:
    args = deployment.engine_args
    if "model" in args:
        raise ConfigError("engine_args.model: set the model with the top-level 'model' key instead")
    known = vllm_engine_arg_types()
    if known is not None:
        for key, value in args.items():
            if key not in known:
                raise ConfigError(
                    f"engine_args.{key}: not a vLLM AsyncEngineArgs field; {did_you_mean(key, sorted(known))}"
                )
            if _accepts(known[key], value) is False:
                expected = str(known[key]).replace("typing.", "").replace("<class '", "").replace("'>", "")
                raise ConfigError(f"engine_args.{key}: vLLM expects {expected}, got {type(value).__name__} {value!r}")
    if deployment.lora_adapters and args.get("enable_lora") is not True:
        raise ConfigError(
            "lora_adapters: vLLM serves adapters only with engine_args.enable_lora: true; add it (and max_loras"
            " above the number of adapters used at once, max_lora_rank >= the adapters' rank)"
        )


def read_deployment_doc(path: Path, variables: dict[str, str] | None = None) -> dict[str, Any]:
    """A deployment file's YAML, its `${NAME}` placeholders filled."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    return substitute(doc, variables or {})


def deployment_from_doc(doc: Any, path: Path) -> Deployment:
    """A deployment file's (filled) YAML, parsed and checked; relative paths resolve from the file's folder."""
    deployment = parse_deployment(doc)
    deployment.base_dir = Path(path).resolve().parent
    check_deployment(deployment)
    return deployment


def load_deployment(path: Path, variables: dict[str, str] | None = None) -> Deployment:
    return deployment_from_doc(read_deployment_doc(path, variables), path)
