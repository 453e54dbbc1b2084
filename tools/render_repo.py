"""Render a whole Triton model repository from one deployment config.

    python tools/render_repo.py [CONFIG] [--out DIR] [--check] [--dry-run] [--set NAME=VALUE ...]
                                [--relative-model-paths]

CONFIG defaults to deployments/default.yaml and --out to model_repository/. The same config always gives the
same bytes. Nothing is written unless the whole config is valid (exit 2 with a message naming the key path and
the fix): keys and types, placeholders, engine args against vLLM's AsyncEngineArgs, model names, and the stages'
declared tensors against their neighbours and Triton's ensemble rules. --check compares with the existing tree
and exits 1 on any difference; --dry-run lists the files that would be written; --set fills ${NAME}.
Local paths (model, LoRA adapters, chat template file) inside the output's project (the nearest folder above it
with .git) are written relative to the output; any other is written absolute unless --relative-model-paths."""

from __future__ import annotations

import argparse
import difflib
import functools
import importlib.machinery
import json
import os
import re
import sys
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: make the project's packages importable
    sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from core import interface as tensors  # noqa: E402
from core.interface import NUMPY_DTYPES, TensorSpec  # noqa: E402
from core.settings import (  # noqa: E402
    SETTINGS_FILE,
    CoreSettings,
    EntrySettings,
    GenerateSettings,
    HealthSettings,
    SenderSettings,
    Settings,
)
from core.stage import load_stage_class  # noqa: E402

DEFAULT_CONFIG = ROOT / "deployments" / "default.yaml"
DEFAULT_OUT = ROOT / "model_repository"
HEADER = "# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.\n"


ENTRY_KINDS = ("ensemble", "bls")


class ConfigError(ValueError):
    """A deployment config that cannot be rendered; the message names the key path and the fix."""


# The deployment config schema ----------------------------------------------------------------------------
# Every key is typed here; README.md's config table documents each one (type, default, meaning).

# Built-in stage variants: `preprocess.class: raw` swaps the stage in one line. Anything with a ":" is a
# deployment's own class, `package.module:Class`, implementing core/stage.py's interface.
BUILTIN_STAGES: dict[str, dict[str, str]] = {
    "preprocess": {
        "default": "preprocess.default:Preprocessor",
        "raw": "preprocess.raw:RawPreprocessor",
    },
    "postprocess": {
        "vllm_backend": "postprocess.vllm_backend:VllmBackendPostprocessor",
        "openai": "postprocess.openai:OpenAIPostprocessor",
    },
}


BUILTIN_STAGES_PATHS = frozenset(path for variants in BUILTIN_STAGES.values() for path in variants.values())


@dataclass
class StageConfig:
    cls: str = ""  # a built-in variant's name or `package.module:Class`; "" = the role's default
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
class ChatTemplateConfig:
    inline: str | None = None  # the Jinja template itself
    file: str | None = None  # or a file with it, relative to the config file
    allow_per_request: bool = False  # may a request bring its own template


@dataclass
class ImagesConfig:
    max_bytes: int | None = None
    max_pixels: int | None = None
    max_images: int | None = None


@dataclass
class HealthConfig:
    # What the core does when vLLM's engine dies (its EngineCore process crashes or is killed). Triton 2.51's
    # Python backend cannot mark a model not ready, so without a restart the core answers UNAVAILABLE forever.
    restart_engine: bool = True
    max_restarts: int = 3  # restarts in a row that do not hold (fail, or die within a minute) before giving up
    restart_backoff_seconds: float = 1.0  # wait before restart k: this x 2^(k-1)


@dataclass
class CoreConfig:
    # Threads that send the core's responses to Triton; each send is a round trip to tritonserver, so several
    # threads keep several in flight (a request stays on one thread: its responses keep their order).
    sender_threads: int = 1
    # Python's GIL switch interval in the core's stub, in ms (0: Python's default, 5 ms). A thread back from an
    # IPC wait waits up to this long for the GIL while the engine loop computes.
    switch_interval_ms: float = 0.0


@dataclass
class Deployment:
    model: str
    engine_args: dict[str, Any] = field(default_factory=dict)
    names: Names = field(default_factory=Names)
    preprocess: StageConfig = field(default_factory=lambda: StageConfig("default", 1))
    postprocess: StageConfig = field(default_factory=lambda: StageConfig("vllm_backend", 1))
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    lora_adapters: dict[str, str] = field(default_factory=dict)
    chat_template: ChatTemplateConfig | None = None
    images: ImagesConfig | None = None
    metrics: bool = False
    # Environment variables for the engine's process, set by the core before vLLM starts (the EngineCore inherits
    # them): vLLM's own knobs that are not engine args, e.g. OMP_NUM_THREADS or VLLM_CPU_OMP_THREADS_BIND.
    engine_env: dict[str, str] = field(default_factory=dict)
    # A stream's deltas of one request are sent at most once per this many ms (merged; the first and the final
    # never wait). 0: every delta as soon as the core's sender is free (queued ones still merge).
    stream_interval_ms: int = 0
    health: HealthConfig = field(default_factory=HealthConfig)
    core: CoreConfig = field(default_factory=CoreConfig)
    # "ensemble": the public names are ensembles (pre -> core/generate -> post). "bls": they are Python entry
    # models running the stages in-process and the core by BLS, which is what lets a client's cancel abort
    # the engine request on Triton 2.51 (an ensemble step never sees it; DESIGN.md rule 5).
    entry: str = "ensemble"
    # Folders with the deployment's own stage code (`preprocess/postprocess.class: module:Class`), relative to the
    # config file or absolute: the stubs put them on sys.path before loading the class (Triton's Python stubs
    # do not read PYTHONPATH).
    code_paths: list[str] = field(default_factory=list)
    base_dir: Path = field(default=ROOT, repr=False)  # the config file's folder: relative paths start there


# YAML key -> dataclass field, where they differ ("class" is a Python keyword).
_KEY_ALIASES = {"class": "cls"}
_FIELD_KEYS = {v: k for k, v in _KEY_ALIASES.items()}


def _did_you_mean(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(str(key), options, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(options)}."


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
            raise ConfigError(f"{where}: unknown key; {_did_you_mean(str(key), options)}")
        values[name] = _typed(known[name].type, value, where)
    missing = [
        _FIELD_KEYS.get(f.name, f.name)
        for f in fields(cls)
        if f.name not in values and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ConfigError(f"{path or 'config'}: missing required key(s) {missing}; add them to the config")
    return cls(**values)


_NESTED = {
    "Names": Names,
    "StageConfig": StageConfig,
    "GenerateConfig": GenerateConfig,
    "ChatTemplateConfig": ChatTemplateConfig,
    "ImagesConfig": ImagesConfig,
    "HealthConfig": HealthConfig,
    "CoreConfig": CoreConfig,
}
_SCALARS = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "dict[str, Any]": dict,
    "dict[str, str]": dict,
    "list[str]": list,
}


def _typed(annotation: str, value: Any, where: str) -> Any:
    if annotation.endswith(" | None"):
        if value is None:
            return None
        annotation = annotation.removesuffix(" | None")
    if annotation in _NESTED:
        return _build(_NESTED[annotation], value, where)
    expected = _SCALARS[annotation]
    if expected is not bool and isinstance(value, bool) or not isinstance(value, expected):
        shown = "null" if value is None else f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{where}: expected {annotation}, got {shown}")
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ConfigError(f"{where}: keys must be strings, got {key!r}")
    if annotation == "dict[str, str]":
        for key, item in value.items():
            if not isinstance(item, str):
                raise ConfigError(f"{where}.{key}: expected str, got {type(item).__name__} {item!r}")
    if annotation == "list[str]":
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(f"{where}[{index}]: expected str, got {type(item).__name__} {item!r}")
    return value


_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def substitute(doc: Any, variables: dict[str, str], where: str = "") -> Any:
    """Replace `${NAME}` in every string of the raw config by `variables[NAME]` (from `--set NAME=VALUE`).

    A value that is exactly one placeholder takes the YAML type of its replacement (`--set N=2` gives an int).
    Any placeholder left over is an error that names the key: unlike `string.Template.safe_substitute`, nothing
    unresolved ever reaches a written file.
    """
    if isinstance(doc, dict):
        return {k: substitute(v, variables, f"{where}.{k}" if where else str(k)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [substitute(v, variables, f"{where}[{i}]") for i, v in enumerate(doc)]
    if not isinstance(doc, str) or "${" not in doc:
        return doc
    whole = _PLACEHOLDER.fullmatch(doc)
    if whole and whole.group(1) in variables:
        return yaml.safe_load(variables[whole.group(1)])
    text = _PLACEHOLDER.sub(lambda m: variables.get(m.group(1), m.group(0)), doc)
    if "${" in text:
        left = _PLACEHOLDER.search(text)
        name = left.group(1) if left else "NAME"
        raise ConfigError(
            f"{where or 'config'}: unresolved placeholder in {doc!r}; pass --set {name}=VALUE or write the value"
        )
    return text


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


STAGE_ROLES = ("preprocess", "postprocess")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_INSTANCE_KEYS = ("preprocess", "postprocess", "generate")


def check_deployment(deployment: Deployment) -> None:
    """Rules that span keys, checked before anything is written."""
    for key in _INSTANCE_KEYS:
        if getattr(deployment, key).instances < 1:
            raise ConfigError(f"{key}.instances: must be >= 1")
    if deployment.generate.max_in_flight < 1:
        raise ConfigError("generate.max_in_flight: must be >= 1")
    for f in fields(Names):
        name = getattr(deployment.names, f.name)
        if not _MODEL_NAME.match(name):
            raise ConfigError(
                f"names.{f.name}: {name!r} is not a usable model name; use letters, digits, '_', '.', '-'"
            )
    if deployment.entry not in ENTRY_KINDS:
        raise ConfigError(f"entry: must be one of {', '.join(ENTRY_KINDS)}, got {deployment.entry!r}")
    names = [getattr(deployment.names, f.name) for f in fields(Names)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"names: model names must differ, {duplicates} used twice; rename one of them")
    _check_engine_args(deployment)
    if not 0 <= deployment.stream_interval_ms <= 1000:
        raise ConfigError(f"stream_interval_ms: {deployment.stream_interval_ms} is outside 0..1000")
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
    if not 1 <= deployment.core.sender_threads <= 64:
        raise ConfigError(f"core.sender_threads: {deployment.core.sender_threads} is outside 1..64")
    if not 0 <= deployment.core.switch_interval_ms <= 100:
        raise ConfigError(f"core.switch_interval_ms: {deployment.core.switch_interval_ms} is outside 0..100")
    if deployment.health.max_restarts < 1:
        raise ConfigError("health.max_restarts: must be >= 1 (to never restart, set health.restart_engine: false)")
    if not 0 <= deployment.health.restart_backoff_seconds <= 3600:
        raise ConfigError("health.restart_backoff_seconds: must be between 0 and 3600")
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
    if deployment.images is not None:
        for f in fields(ImagesConfig):
            value = getattr(deployment.images, f.name)
            if value is not None and value < 1:
                raise ConfigError(f"images.{f.name}: must be >= 1 (or left out for the preprocess default)")


def _check_engine_args(deployment: Deployment) -> None:
    args = deployment.engine_args
    if "model" in args:
        raise ConfigError("engine_args.model: set the model with the top-level 'model' key instead")
    known = vllm_engine_arg_types()
    if known is not None:
        for key, value in args.items():
            if key not in known:
                raise ConfigError(
                    f"engine_args.{key}: not a vLLM AsyncEngineArgs field; {_did_you_mean(key, sorted(known))}"
                )
            if _accepts(known[key], value) is False:
                expected = str(known[key]).replace("typing.", "").replace("<class '", "").replace("'>", "")
                raise ConfigError(f"engine_args.{key}: vLLM expects {expected}, got {type(value).__name__} {value!r}")
    if deployment.lora_adapters and args.get("enable_lora") is not True:
        raise ConfigError(
            "lora_adapters: vLLM serves adapters only with engine_args.enable_lora: true; add it (and max_loras"
            " above the number of adapters used at once, max_lora_rank >= the adapters' rank)"
        )


def load_deployment(path: Path, variables: dict[str, str] | None = None) -> Deployment:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    doc = substitute(doc, variables or {})
    deployment = _build(Deployment, doc, "")
    deployment.base_dir = path.resolve().parent
    check_deployment(deployment)
    return deployment


# Stages and the ensemble wiring ----------------------------------------------------------------------------


def stage_path(role: str, value: str) -> str:
    """`package.module:Class` for a stage key: a built-in variant's name or a deployment's own class."""
    if ":" in value:
        return value
    builtin = BUILTIN_STAGES[role]
    if not value:  # a stage section without `class` keeps the built-in default
        return next(iter(builtin.values()))
    if value in builtin:
        return builtin[value]
    raise ConfigError(
        f"{role}.class: {value!r} is not a built-in {role} ({', '.join(builtin)}); "
        f"{_did_you_mean(value, list(builtin))} Or give your own class as 'package.module:ClassName'."
    )


def code_dirs(deployment: Deployment) -> list[Path]:
    """The deployment's code_paths as absolute folders."""
    return [Path(os.path.abspath(deployment.base_dir / folder)) for folder in deployment.code_paths]


def _under(file: str | None, folders: list[Path]) -> bool:
    return file is not None and any(Path(os.path.abspath(file)).is_relative_to(f) for f in folders)


def _stub_invisible_folders() -> list[Path]:
    """Folders on this process's import path that a Triton Python stub may not have: PYTHONPATH's entries (its
    interpreter is isolated) and the current directory (the stub's is the server's). A class found only there
    imports here but maybe not where it is served."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if "" in sys.path or os.curdir in sys.path:
        entries.append(os.getcwd())
    return [Path(os.path.abspath(e)) for e in entries if not Path(os.path.abspath(e)).is_relative_to(ROOT)]


def _import_stage_class(where: str, path: str, folders: list[Path]) -> type:
    """Import a stage class the way the served stub will: the code_paths folders first on sys.path."""
    if ":" not in path:
        return load_stage_class(path)  # malformed: load_stage_class says why
    module_name = path.partition(":")[0]
    top = module_name.split(".")[0]
    dirs = [str(f) for f in folders]
    in_code_paths = bool(dirs) and importlib.machinery.PathFinder.find_spec(top, dirs) is not None
    if in_code_paths:
        others = [p for p in sys.path if p not in dirs]
        elsewhere = importlib.machinery.PathFinder.find_spec(top, others)
        if top in sys.builtin_module_names or (elsewhere is not None and not _under(elsewhere.origin, folders)):
            where_else = "built into Python" if elsewhere is None else f"also at {elsewhere.origin}"
            raise ConfigError(
                f"{where}: module {top!r} in code_paths is {where_else}; the served stub would import the other one"
                " (or yours would shadow it): rename your module"
            )
    sys.path[:0] = dirs
    try:
        cls = load_stage_class(path)
        module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    finally:
        del sys.path[: len(dirs)]
        # Forget the modules of the code_paths: another render in this process (other folders, or none) must
        # import as a fresh stub would, not find these in the cache.
        for name, module in list(sys.modules.items()):
            if _under(getattr(module, "__file__", None), folders):
                del sys.modules[name]
    if not in_code_paths and _under(module_file, _stub_invisible_folders()):
        raise ConfigError(
            f"{where}: {path!r} imports here only through PYTHONPATH or the current directory ({module_file});"
            " Triton's Python stubs do not read PYTHONPATH and see the current directory only when the server"
            " starts in it: list its folder under code_paths"
        )
    return cls


def load_stage(role: str, value: str, folders: list[Path] | None = None) -> type:
    """The stage class of a role; `folders`: the deployment's code_paths (see code_dirs)."""
    where = f"{role}.class"
    path = stage_path(role, value)
    try:
        cls = _import_stage_class(where, path, folders or [])
    except ConfigError:
        raise
    except ValueError as exc:
        hint = "" if folders else " (a module in a folder of your own: list the folder under code_paths)"
        raise ConfigError(f"{where}: {exc}{hint}") from exc
    for attr in ("inputs", "outputs"):
        specs = getattr(cls, attr, None)
        if not isinstance(specs, tuple) or not all(isinstance(t, TensorSpec) for t in specs):
            raise ConfigError(f"{where}: {cls.__name__}.{attr} must be a tuple of core.interface.TensorSpec")
        if not specs:
            raise ConfigError(f"{where}: {cls.__name__}.{attr} is empty; a stage needs at least one {attr[:-1]}")
        seen = [t.name for t in specs]
        twice = sorted({n for n in seen if seen.count(n) > 1})
        if twice:
            raise ConfigError(f"{where}: {cls.__name__}.{attr} declares {twice} more than once")
        for t in specs:
            if t.data_type not in NUMPY_DTYPES:
                raise ConfigError(
                    f"{where}: {cls.__name__} tensor {t.name!r} has type {t.data_type!r}; use one of"
                    f" {', '.join(NUMPY_DTYPES)}"
                )
    if getattr(cls, "decoupled", False):
        # Rule 2.1: a decoupled step would make the plain ensemble decoupled (no more HTTP /infer, ModelInfer).
        raise ConfigError(
            f"{where}: {cls.__name__} declares decoupled = True; stages run as non-decoupled models (Triton makes"
            " an ensemble with a decoupled step decoupled, and a decoupled model refuses HTTP /infer and gRPC"
            " ModelInfer): produce one response per request"
        )
    return cls


def _signature(t: TensorSpec) -> str:
    return f"{t.data_type} {list(t.dims)}"


def check_wiring(pre_cls: type, post_cls: type, names: Names) -> None:
    """The ensembles' wiring, as Triton would check it at load time (and DESIGN.md rules 2.1-2.2)."""
    core_in, core_out = tensors.ENGINE_REQUEST, tensors.ENGINE_RESPONSE
    pre_out = {t.name: t for t in pre_cls.outputs}
    produced = pre_out.get(core_in.name)
    if produced is None:
        raise ConfigError(
            f"preprocess.class: {pre_cls.__name__} outputs {sorted(pre_out)}, but the core ({names.core}) consumes"
            f" {core_in.name!r} ({_signature(core_in)}): the preprocess stage must output it"
        )
    if _signature(produced) != _signature(core_in):
        raise ConfigError(
            f"preprocess.class: {pre_cls.__name__} outputs {core_in.name!r} as {_signature(produced)}; the core"
            f" ({names.core}) takes {_signature(core_in)}: declare it as core.interface.{core_in.name.upper()}"
        )
    unused = sorted(set(pre_out) - {core_in.name})
    if unused:
        raise ConfigError(
            f"preprocess.class: {pre_cls.__name__} outputs {unused}, which no step consumes (the core takes only"
            f" {core_in.name!r}); put what later steps need into the engine request's postprocess_options"
        )
    post_in = {t.name: t for t in post_cls.inputs}
    foreign = sorted(set(post_in) - {core_out.name})
    if foreign:
        # Rule 2.2: in the streaming ensemble postprocess follows the decoupled core; feeding it a request input
        # (or a preprocess output) as well makes Triton refuse the ensemble at load time.
        raise ConfigError(
            f"postprocess.class: {post_cls.__name__} needs {foreign}, which the core ({names.core}) does not"
            f" produce (it outputs only {core_out.name!r}); a step after the decoupled core may only consume"
            " that core's outputs (Triton refuses an ensemble step that mixes a decoupled step's outputs with other"
            " tensors at load time), so these would have to come from the request and Triton would refuse the"
            " streaming ensemble: carry per-request options in EngineRequest.postprocess_options"
        )
    consumed = post_in[core_out.name]  # the only input left: inputs are never empty (load_stage)
    if _signature(consumed) != _signature(core_out):
        raise ConfigError(
            f"postprocess.class: {post_cls.__name__} takes {core_out.name!r} as {_signature(consumed)}; the core"
            f" outputs {_signature(core_out)}: declare it as core.interface.{core_out.name.upper()}"
        )
    both = sorted({t.name for t in pre_cls.inputs} & {t.name for t in post_cls.outputs})
    if both:
        raise ConfigError(
            f"preprocess.class / postprocess.class: {both} would be both an input and an output of the ensembles"
            " (one tensor name can be produced only once in an ensemble); rename one side"
        )
    internal = {"_" + core_in.name, "_" + core_out.name}
    clash = sorted(internal & ({t.name for t in pre_cls.inputs} | {t.name for t in post_cls.outputs}))
    if clash:
        raise ConfigError(f"preprocess.class / postprocess.class: {clash} are reserved for the ensembles' wiring")


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
    preserve_ordering: bool = False,
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
    if preserve_ordering:
        config["dynamic_batching"] = {"preserve_ordering": True}
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
    # ASCII only (non-ASCII as \uXXXX escapes): the 2.51 Python-backend stub runs with LC_CTYPE=C, where the
    # adapters' Path.read_text() decodes as ASCII; a "ü" in stage.json made a model fail to load (found by
    # tests/test_render_property.py).
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


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


def project_root(out: Path) -> Path:
    """The project folder that holds the output: the nearest folder at or above it with a `.git` (this project's
    own folder for an output inside it). Without one, the output folder itself."""
    out = Path(os.path.abspath(out))
    for folder in (out, *out.parents):
        if folder == ROOT or (folder / ".git").exists():
            return folder
    return out


def _repo_path(path: Path, out: Path, relative: bool = False) -> str:
    """A local path as a rendered file writes it. Inside the output's project (see project_root) it is relative
    to the output, so the project can move as a whole and the checked-in repository is the same on every machine;
    anything else is absolute, so the rendered repository can move on its own. `relative`: always relative
    (`--relative-model-paths`). The adapters resolve "./" and "../" against the repository root."""
    path = Path(os.path.abspath(path))
    out = Path(os.path.abspath(out))
    if not relative and not path.is_relative_to(project_root(out)):
        return str(path)
    relative_path = os.path.relpath(path, out)
    return relative_path if relative_path.startswith("../") else "./" + relative_path


def render(deployment: Deployment, out: Path, relative_paths: bool = False) -> dict[str, str]:
    """Every file of the repository, by path relative to `out`. `relative_paths`: write every local path
    relative to `out`, also those outside its project (which are absolute otherwise; see _repo_path)."""
    names = deployment.names
    folders = code_dirs(deployment)
    pre_cls = load_stage("preprocess", deployment.preprocess.cls, folders)
    post_cls = load_stage("postprocess", deployment.postprocess.cls, folders)
    check_wiring(pre_cls, post_cls, names)
    if stage_path("preprocess", deployment.preprocess.cls) == BUILTIN_STAGES["preprocess"]["raw"]:
        for key in ("chat_template", "images"):
            if getattr(deployment, key) is not None:
                raise ConfigError(
                    f"{key}: the raw preprocess takes the prompt text only (no chat template, no images);"
                    " remove the key or use preprocess.class: default"
                )

    model = deployment.model
    if _is_local(model):
        model = _repo_path(deployment.base_dir / model, out, relative_paths)
    engine_args = {**deployment.engine_args, "model": model}
    lora_paths = {
        name: (_repo_path(deployment.base_dir / p, out, relative_paths) if _is_local(p) else p)
        for name, p in sorted(deployment.lora_adapters.items())
    }
    pre_settings = {
        "tokenizer": engine_args.get("tokenizer", model),
        "max_model_len": engine_args.get("max_model_len"),
        "max_logprobs": engine_args.get("max_logprobs", 20),
        "lora_names": sorted(lora_paths),
        **_preprocess_options(deployment, out, relative_paths),
        **deployment.preprocess.settings,
    }
    # tokenizer: the engine's; postprocess turns the engine's token ids into text (postprocess/detokenize.py)
    post_settings = {
        "model_name": names.plain,
        "tokenizer": engine_args.get("tokenizer", model),
        **deployment.postprocess.settings,
    }

    files: dict[str, str] = {}
    files[f"{names.preprocess}/config.pbtxt"] = _python_model(
        names.preprocess, pre_cls.inputs, pre_cls.outputs, deployment.preprocess.instances, "KIND_CPU"
    )
    files[f"{names.preprocess}/1/model.py"] = _model_py("StageModel", "the preprocess stage")
    # A stage of the deployment's own carries the code_paths (the same path rule as the model), which its adapter
    # puts on sys.path: pointing at the folders, not copying them, keeps the code editable where it is and the
    # repository text-only, as with the model.
    code_paths = [_repo_path(folder, out, relative_paths) for folder in folders]
    files[f"{names.preprocess}/1/stage.json"] = _json(
        _stage_spec(stage_path("preprocess", deployment.preprocess.cls), pre_settings, code_paths)
    )

    files[f"{names.postprocess}/config.pbtxt"] = _python_model(
        names.postprocess,
        post_cls.inputs,
        post_cls.outputs,
        deployment.postprocess.instances,
        "KIND_CPU",
        # The streaming ensemble runs postprocess once per delta. With several instances Triton 2.51 delivered
        # some of a stream's deltas out of order (measured: 3 of 256 streams); the scheduler's documented
        # preserve_ordering returns responses in request order (measured: 0 of 192, and the suite's test).
        preserve_ordering=deployment.postprocess.instances > 1,
    )
    files[f"{names.postprocess}/1/model.py"] = _model_py("StageModel", "the postprocess stage")
    files[f"{names.postprocess}/1/stage.json"] = _json(
        _stage_spec(stage_path("postprocess", deployment.postprocess.cls), post_settings, code_paths)
    )

    core_io = ((tensors.ENGINE_REQUEST,), (tensors.ENGINE_RESPONSE,))
    files[f"{names.core}/config.pbtxt"] = _python_model(
        names.core,
        *core_io,
        1,  # one engine; it spans the GPUs itself (tensor_parallel_size), hence KIND_MODEL as the vLLM backend
        "KIND_MODEL",
        decoupled=True,
    )
    files[f"{names.core}/1/model.py"] = _model_py("CoreModel", "the vLLM core (decoupled, owns the engine)")
    files[f"{names.core}/1/model.json"] = _json(engine_args)
    files[f"{names.core}/1/{SETTINGS_FILE}"] = _settings(core_settings(deployment))
    if lora_paths:
        files[f"{names.core}/1/multi_lora.json"] = _json(lora_paths)

    files[f"{names.generate}/config.pbtxt"] = _python_model(
        names.generate,
        *core_io,
        deployment.generate.instances,
        "KIND_CPU",
    )
    generate = GenerateSettings(core_model=names.core, max_in_flight=deployment.generate.max_in_flight)
    files[f"{names.generate}/1/{SETTINGS_FILE}"] = _settings(generate)
    files[f"{names.generate}/1/model.py"] = _model_py("GenerateModel", "generate (BLS over the core, one response)")

    if deployment.entry == "bls":
        # The same classes and settings as the stage models' stage.json (one derivation, above).
        stages = {
            "preprocess": json.loads(files[f"{names.preprocess}/1/stage.json"]),
            "postprocess": json.loads(files[f"{names.postprocess}/1/stage.json"]),
        }
        for entry, stream in ((names.plain, False), (names.streaming, True)):
            files[f"{entry}/config.pbtxt"] = _python_model(
                entry,
                pre_cls.inputs,
                post_cls.outputs,
                deployment.generate.instances,
                "KIND_CPU",
                decoupled=stream,
            )
            files[f"{entry}/1/{SETTINGS_FILE}"] = _settings(EntrySettings(**dict(generate), stream=stream))
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


def core_settings(deployment: Deployment) -> CoreSettings:
    """What the core's adapter reads (settings.json), from the deployment's keys of the same names."""
    return CoreSettings(
        metrics=deployment.metrics,
        engine_env=deployment.engine_env,
        stream_interval_ms=deployment.stream_interval_ms,
        health=HealthSettings(**vars(deployment.health)),
        core=SenderSettings(**vars(deployment.core)),
    )


def _settings(settings: Settings) -> str:
    return _json(settings.model_dump(mode="json"))


def _stage_spec(cls: str, settings: dict[str, Any], code_paths: list[str]) -> dict[str, Any]:
    """stage.json: the class, its settings and, for a class of the deployment's own, the folders it imports from."""
    spec: dict[str, Any] = {"class": cls, "settings": settings}
    if code_paths and cls not in BUILTIN_STAGES_PATHS:
        spec["code_paths"] = code_paths
    return spec


def _preprocess_options(deployment: Deployment, out: Path, relative_paths: bool) -> dict[str, Any]:
    """The top-level chat_template and images keys, as the preprocess stage's settings."""
    options: dict[str, Any] = {}
    template = deployment.chat_template
    if template is not None:
        if template.inline is not None:
            options["chat_template"] = template.inline
        elif template.file is not None:
            options["chat_template_file"] = _repo_path(deployment.base_dir / str(template.file), out, relative_paths)
        options["allow_request_chat_template"] = template.allow_per_request
    if deployment.images is not None:
        for key, value in (
            ("max_image_bytes", deployment.images.max_bytes),
            ("max_image_pixels", deployment.images.max_pixels),
            ("max_images", deployment.images.max_images),
        ):
            if value is not None:
                options[key] = value
    return options


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
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="the value of ${NAME} in the config"
    )
    parser.add_argument(
        "--relative-model-paths",
        action="store_true",
        help="write local paths outside the output's project (model, adapters, chat template) relative to the"
        " output too; by default they are absolute, so the rendered repository can move",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if --out differs from the rendering")
    mode.add_argument("--dry-run", action="store_true", help="list the files that would be written")
    args = parser.parse_args(argv)
    variables = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--set {item!r}: expected NAME=VALUE")
        variables[name] = value
    try:
        files = render(load_deployment(args.config, variables), args.out, args.relative_model_paths)
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
