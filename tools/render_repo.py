"""Render a whole Triton model repository from one deployment config.

    python tools/render_repo.py [CONFIG] [--out DIR] [--check] [--dry-run]

CONFIG defaults to deployments/default.yaml and --out to model_repository/. The same config always gives the
same bytes. Nothing is written unless the whole config is valid. --check compares with the existing tree and
exits 1 on any difference; --dry-run lists the files that would be written.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the project's packages importable
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from core import interface as tensors  # noqa: E402
from core.interface import TensorSpec  # noqa: E402
from core.stage import load_stage_class  # noqa: E402

DEFAULT_CONFIG = ROOT / "deployments" / "default.yaml"
DEFAULT_OUT = ROOT / "model_repository"
HEADER = "# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.\n"


ENTRY_KINDS = ("ensemble", "bls")


class ConfigError(ValueError):
    """A deployment config that cannot be rendered; the message names the key path and the fix."""


# The deployment config schema ----------------------------------------------------------------------------


@dataclass
class StageConfig:
    cls: str = ""
    instances: int = 1
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerateConfig:
    instances: int = 1
    max_in_flight: int = 512


@dataclass
class Names:
    plain: str = "vllm_model"
    streaming: str = "vllm_model_stream"
    core: str = "vllm_core"
    generate: str = "generate"
    preprocess: str = "preprocess"
    postprocess: str = "postprocess"


@dataclass
class Deployment:
    model: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    names: Names = field(default_factory=Names)
    preprocess: StageConfig = field(default_factory=lambda: StageConfig("preprocess.default:Preprocessor", 1))
    postprocess: StageConfig = field(
        default_factory=lambda: StageConfig("postprocess.vllm_backend:VllmBackendPostprocessor", 1)
    )
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    lora_adapters: dict[str, str] = field(default_factory=dict)
    # "ensemble": the public names are ensembles (pre -> core/generate -> post). "bls": they are Python entry
    # models running the stages in-process and the core by BLS, which is what lets a client's cancel abort
    # the engine request on Triton 2.51 (an ensemble step never sees it; DESIGN.md rule 5).
    entry: str = "ensemble"
    base_dir: Path = field(default=ROOT, repr=False)  # the config file's folder: relative paths start there


# YAML key -> dataclass field, where they differ ("class" is a Python keyword).
_KEY_ALIASES = {"class": "cls"}
_FIELD_KEYS = {v: k for k, v in _KEY_ALIASES.items()}


def _build(cls: type, doc: Any, path: str) -> Any:
    if not isinstance(doc, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(doc).__name__}")
    known = {f.name: f for f in fields(cls) if f.name != "base_dir"}
    values: dict[str, Any] = {}
    for key, value in doc.items():
        name = _KEY_ALIASES.get(key, key)
        where = f"{path}.{key}" if path else str(key)
        if name not in known:
            options = [_FIELD_KEYS.get(k, k) for k in known]
            close = difflib.get_close_matches(str(key), options, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(options)}"
            raise ConfigError(f"{where}: unknown key{hint}")
        values[name] = _typed(known[name].type, value, where)
    try:
        return cls(**values)
    except TypeError as exc:
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in values and f.default is MISSING and f.default_factory is MISSING
        ]
        raise ConfigError(f"{path or 'config'}: missing required key(s) {missing}") from exc


_NESTED = {"Names": Names, "StageConfig": StageConfig, "GenerateConfig": GenerateConfig}


def _typed(annotation: str, value: Any, where: str) -> Any:
    if annotation in _NESTED:
        return _build(_NESTED[annotation], value, where)
    expected = {"str": str, "int": int, "dict[str, Any]": dict, "dict[str, str]": dict}[annotation]
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(f"{where}: expected {annotation}, got {type(value).__name__} {value!r}")
    if annotation == "dict[str, str]" and not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(f"{where}: every value must be a string")
    if isinstance(value, str) and "${" in value:
        raise ConfigError(f"{where}: unresolved placeholder in {value!r}")
    return value


def check_deployment(deployment: Deployment) -> None:
    """Rules that span keys, checked before anything is written."""
    for key in ("preprocess", "postprocess", "generate"):
        if getattr(deployment, key).instances < 1:
            raise ConfigError(f"{key}.instances: must be >= 1")
    if deployment.postprocess.instances != 1:
        # Measured on Triton 2.51: the streaming ensemble runs postprocess once per delta, and with several
        # instances a stream's deltas reached the client out of order. One instance keeps them in order.
        raise ConfigError(
            "postprocess.instances: must be 1; with more, Triton may deliver a stream's deltas out of order"
            " (each delta is a separate postprocess execution)"
        )
    if deployment.entry not in ENTRY_KINDS:
        raise ConfigError(f"entry: must be one of {', '.join(ENTRY_KINDS)}, got {deployment.entry!r}")
    names = [getattr(deployment.names, f.name) for f in fields(Names)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"names: model names must differ, {duplicates} used twice")


def load_deployment(path: Path) -> Deployment:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    deployment = _build(Deployment, doc, "")
    deployment.base_dir = path.resolve().parent
    check_deployment(deployment)
    return deployment


# Rendering -------------------------------------------------------------------------------------------------


class Enum(str):
    """A protobuf enum value: written without quotes."""


def _pbtxt_value(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def pbtxt(message: dict[str, Any], indent: int = 0) -> str:
    """Protobuf text format for a dict; list values of dicts become repeated fields."""
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if isinstance(value, dict):
            lines.append(f"{pad}{key} {{\n{pbtxt(value, indent + 1)}{pad}}}\n")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines.append(f"{pad}{key} {{\n{pbtxt(item, indent + 1)}{pad}}}\n")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ {', '.join(_pbtxt_value(v) for v in value)} ]\n")
        else:
            lines.append(f"{pad}{key}: {_pbtxt_value(value)}\n")
    return "".join(lines)


def _tensor(spec: TensorSpec, optional: bool | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": spec.name, "data_type": Enum(spec.data_type), "dims": list(spec.dims)}
    if spec.optional if optional is None else optional:
        entry["optional"] = True
    return entry


def _parameters(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"key": k, "value": {"string_value": v}} for k, v in values.items()]


def _python_model(
    name: str,
    inputs: tuple[TensorSpec, ...],
    outputs: tuple[TensorSpec, ...],
    instances: int,
    kind: str,
    decoupled: bool = False,
    parameters: dict[str, str] | None = None,
) -> str:
    config: dict[str, Any] = {
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "input": [_tensor(t) for t in inputs],
        "output": [_tensor(t, optional=False) for t in outputs],
        "instance_group": [{"count": instances, "kind": Enum(kind)}],
    }
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    if parameters:
        config["parameters"] = _parameters(parameters)
    return HEADER + pbtxt(config)


def _model_py(adapter: str, role: str) -> str:
    return (
        HEADER
        + f'"""Triton adapter for {role}; the logic lives in core/ and the stage packages."""\n\n'
        + f"from core.triton_models import {adapter} as TritonPythonModel  # noqa: F401\n"
    )


def _json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _ensemble(
    name: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...], steps: list[dict[str, Any]]
) -> str:
    config = {
        "name": name,
        "platform": "ensemble",
        "max_batch_size": 0,
        "input": [_tensor(t) for t in inputs],
        "output": [_tensor(t, optional=False) for t in outputs],
        "ensemble_scheduling": {"step": steps},
    }
    return HEADER + pbtxt(config)


def _step(model: str, input_map: dict[str, str], output_map: dict[str, str]) -> dict[str, Any]:
    return {
        "model_name": model,
        "model_version": -1,
        "input_map": [{"key": k, "value": v} for k, v in input_map.items()],
        "output_map": [{"key": k, "value": v} for k, v in output_map.items()],
    }


def _is_local(model: str) -> bool:
    return model.startswith(("./", "../", "/"))


def _repo_relative(path: Path, out: Path) -> str:
    relative = os.path.relpath(path, out.resolve())
    return relative if relative.startswith("../") else "./" + relative


def render(deployment: Deployment, out: Path) -> dict[str, str]:
    """Every file of the repository, by path relative to `out`."""
    names = deployment.names
    pre_cls = _load_stage(deployment.preprocess.cls, "preprocess.class")
    post_cls = _load_stage(deployment.postprocess.cls, "postprocess.class")

    model = deployment.model
    if _is_local(model):
        model = _repo_relative(deployment.base_dir / model, out)
    engine_args = {**deployment.engine_args, "model": model}
    lora_paths = {
        name: (_repo_relative(deployment.base_dir / p, out) if _is_local(p) else p)
        for name, p in sorted(deployment.lora_adapters.items())
    }
    pre_settings = {
        "tokenizer": engine_args.get("tokenizer", model),
        "max_model_len": engine_args.get("max_model_len"),
        "max_logprobs": engine_args.get("max_logprobs", 20),
        "lora_names": sorted(lora_paths),
        **deployment.preprocess.settings,
    }

    files: dict[str, str] = {}
    files[f"{names.preprocess}/config.pbtxt"] = _python_model(
        names.preprocess, pre_cls.inputs, pre_cls.outputs, deployment.preprocess.instances, "KIND_CPU"
    )
    files[f"{names.preprocess}/1/model.py"] = _model_py("StageModel", "the preprocess stage")
    files[f"{names.preprocess}/1/stage.json"] = _json({"class": deployment.preprocess.cls, "settings": pre_settings})

    files[f"{names.postprocess}/config.pbtxt"] = _python_model(
        names.postprocess, post_cls.inputs, post_cls.outputs, deployment.postprocess.instances, "KIND_CPU"
    )
    files[f"{names.postprocess}/1/model.py"] = _model_py("StageModel", "the postprocess stage")
    files[f"{names.postprocess}/1/stage.json"] = _json(
        {"class": deployment.postprocess.cls, "settings": deployment.postprocess.settings}
    )

    core_io = ((tensors.ENGINE_REQUEST,), (tensors.ENGINE_RESPONSE,))
    files[f"{names.core}/config.pbtxt"] = _python_model(names.core, *core_io, 1, "KIND_MODEL", decoupled=True)
    files[f"{names.core}/1/model.py"] = _model_py("CoreModel", "the vLLM core (decoupled, owns the engine)")
    files[f"{names.core}/1/model.json"] = _json(engine_args)
    if lora_paths:
        files[f"{names.core}/1/multi_lora.json"] = _json(lora_paths)

    files[f"{names.generate}/config.pbtxt"] = _python_model(
        names.generate,
        *core_io,
        deployment.generate.instances,
        "KIND_CPU",
        parameters={"core_model": names.core, "max_in_flight": str(deployment.generate.max_in_flight)},
    )
    files[f"{names.generate}/1/model.py"] = _model_py("GenerateModel", "generate (BLS over the core, one response)")

    if deployment.entry == "bls":
        stages = {
            "preprocess": {"class": deployment.preprocess.cls, "settings": pre_settings},
            "postprocess": {"class": deployment.postprocess.cls, "settings": deployment.postprocess.settings},
        }
        for entry, stream in ((names.plain, False), (names.streaming, True)):
            files[f"{entry}/config.pbtxt"] = _python_model(
                entry,
                pre_cls.inputs,
                post_cls.outputs,
                deployment.generate.instances,
                "KIND_CPU",
                decoupled=stream,
                parameters={
                    "core_model": names.core,
                    "max_in_flight": str(deployment.generate.max_in_flight),
                    "stream": "true" if stream else "false",
                },
            )
            files[f"{entry}/1/model.py"] = _model_py("EntryModel", "a public entry (stages in-process, core by BLS)")
            files[f"{entry}/1/stages.json"] = _json(stages)
        return dict(sorted(files.items()))

    request, response = "_" + tensors.ENGINE_REQUEST.name, "_" + tensors.ENGINE_RESPONSE.name
    public_in = {t.name: t.name for t in pre_cls.inputs}
    public_out = {t.name: t.name for t in post_cls.outputs}
    for ensemble, middle in ((names.plain, names.generate), (names.streaming, names.core)):
        steps = [
            _step(names.preprocess, public_in, {tensors.ENGINE_REQUEST.name: request}),
            _step(middle, {tensors.ENGINE_REQUEST.name: request}, {tensors.ENGINE_RESPONSE.name: response}),
            _step(names.postprocess, {tensors.ENGINE_RESPONSE.name: response}, public_out),
        ]
        files[f"{ensemble}/config.pbtxt"] = _ensemble(ensemble, pre_cls.inputs, post_cls.outputs, steps)
        files[f"{ensemble}/1/.keep"] = ""  # Triton needs a version folder, also for an ensemble
    return dict(sorted(files.items()))


def _load_stage(path: str, where: str) -> Any:
    try:
        return load_stage_class(path)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


# Writing ---------------------------------------------------------------------------------------------------


def existing_files(out: Path) -> dict[str, str]:
    if not out.exists():
        return {}
    return {
        p.relative_to(out).as_posix(): p.read_text()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def write(files: dict[str, str], out: Path) -> None:
    stale = set(existing_files(out)) - set(files)
    for rel in sorted(stale):
        (out / rel).unlink()
    for rel, text in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def drift(files: dict[str, str], out: Path) -> list[str]:
    current = existing_files(out)
    problems = [f"missing: {rel}" for rel in files if rel not in current]
    problems += [f"differs: {rel}" for rel in files if rel in current and current[rel] != files[rel]]
    problems += [f"extra: {rel}" for rel in current if rel not in files]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if --out differs from the rendering")
    mode.add_argument("--dry-run", action="store_true", help="list the files that would be written")
    args = parser.parse_args(argv)
    try:
        files = render(load_deployment(args.config), args.out)
    except ConfigError as exc:
        print(f"render_repo: {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for rel in files:
            print(args.out / rel)
        return 0
    if args.check:
        problems = drift(files, args.out)
        for line in problems:
            print(f"render_repo: {line}", file=sys.stderr)
        return 1 if problems else 0
    write(files, args.out)
    print(f"render_repo: wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
