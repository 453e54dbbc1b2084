"""The deployment config's schema: every key typed, with its default; errors name the key path."""

from __future__ import annotations

import difflib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


DEFAULT_CONFIG = ROOT / "deployments" / "default.yaml"


DEFAULT_OUT = ROOT / "model_repository"


ENTRY_KINDS = ("ensemble", "bls")


class ConfigError(ValueError):
    """A deployment config that cannot be rendered; the message names the key path and the fix."""


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
