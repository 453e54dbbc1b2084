"""The deployment config's schema: every key typed, with its default, as pydantic models; a config that does not
fit raises ConfigError with one line per problem, naming the key path (and the close match of a misspelt key).

The core's keys (metrics, engine_env, stream_interval_ms, health, core) come from core.settings.CoreSettings, which
the core's adapter reads back: their defaults and bounds are written there only. Every key is documented in
README.md's config table (type, default, meaning)."""

from __future__ import annotations

import difflib
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError
from pydantic.fields import FieldInfo

from core.settings import CoreSettings
from preprocess.images import ImageBytes, ImageCount, ImagePixels

ROOT = Path(__file__).resolve().parent.parent


DEFAULT_CONFIG = ROOT / "deployments" / "default.yaml"


DEFAULT_OUT = ROOT / "model_repository"


EntryKind = Literal["ensemble", "bls", "plain-bls", "plain-core"]
ENTRY_KINDS: tuple[str, ...] = typing.get_args(EntryKind)


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


STAGE_ROLES = ("preprocess", "postprocess")


BUILTIN_STAGES_PATHS = frozenset(path for variants in BUILTIN_STAGES.values() for path in variants.values())


class Section(BaseModel):
    # strict: YAML already gives typed values, so a "3" for an int or a 1 for a bool is a mistake to report, not
    # to coerce; forbid: an unknown key is an error with a did-you-mean.
    model_config = ConfigDict(extra="forbid", strict=True, validate_by_name=True)


class StageConfig(Section):
    # a built-in variant's name or `package.module:Class`; "" = the role's default ("class" is a Python keyword)
    cls: str = Field("", alias="class")
    instances: int = Field(1, ge=1)
    settings: dict[str, Any] = Field(default_factory=dict)


class GenerateConfig(Section):
    instances: int = Field(1, ge=1)
    max_in_flight: int = Field(512, ge=1)  # generate's worker threads (core.settings.GenerateSettings)
    # With entry: plain-core, the threads of each plain front end that run the preprocess stage (tokenizing releases
    # the GIL, so a burst of requests is tokenized side by side)
    preprocess_threads: int = Field(4, ge=1, le=64)
    # With entry: plain-core, the plain model probes each request it serves for the client's cancel (a gRPC deadline
    # or cancel, a closed HTTP connection) every 0.5 s and aborts its engine request. Off by default: each probe is an
    # IPC round trip to tritonserver from the front end's process (entry: bls pays for the same watch).
    watch_cancels: bool = False


_MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _model_name(name: str) -> str:
    if not _MODEL_NAME.match(name):
        raise ValueError(f"{name!r} is not a usable model name; use letters, digits, '_', '.', '-'")
    return name


ModelName = Annotated[str, AfterValidator(_model_name)]


class Names(Section):
    plain: ModelName = "vllm_model"
    streaming: ModelName = "vllm_model_stream"
    core: ModelName = "vllm_core"
    generate: ModelName = "generate"
    preprocess: ModelName = "preprocess"
    postprocess: ModelName = "postprocess"


class ChatTemplateConfig(Section):
    inline: str | None = None  # the Jinja template itself
    file: str | None = None  # or a file with it, relative to the config file
    allow_per_request: bool = False  # may a request bring its own template


class ImagesConfig(Section):
    # Left out (None): the preprocess stage's default. The rules are the preprocess stage's own (preprocess/images.py).
    max_bytes: ImageBytes | None = None
    max_pixels: ImagePixels | None = None
    max_images: ImageCount | None = None


class Deployment(CoreSettings, Section):
    """A deployment config. Unlike the core's settings it may be changed after loading (tests derive variants)."""

    model_config = ConfigDict(frozen=False)

    model: str
    engine_args: dict[str, Any] = Field(default_factory=dict)
    names: Names = Field(default_factory=Names)
    preprocess: StageConfig = Field(default_factory=StageConfig)
    postprocess: StageConfig = Field(default_factory=StageConfig)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    lora_adapters: dict[str, str] = Field(default_factory=dict)
    chat_template: ChatTemplateConfig | None = None
    images: ImagesConfig | None = None
    # "ensemble": the public names are ensembles (pre -> core/generate -> post). "bls": they are Python entry
    # models running the stages in-process and the core by BLS, which is what lets a client's cancel abort
    # the engine request on Triton 2.51 (an ensemble step never sees it). "plain-bls": the plain name is such an
    # entry model without the cancel watch (two Python-backend hops fewer per plain request), the streaming one
    # the ensemble. "plain-core": the plain name is the core's adapter itself (not decoupled, generate.instances
    # more front ends of the core's engine, the stages in-process: no hop between Triton and the engine), the
    # streaming one the ensemble.
    entry: EntryKind = "ensemble"
    # Folders with the deployment's own stage code (`preprocess/postprocess.class: module:Class`), relative to the
    # config file or absolute: the stubs put them on sys.path before loading the class (Triton's Python stubs
    # do not read PYTHONPATH).
    code_paths: list[str] = Field(default_factory=list)
    # The config file's folder, where relative paths start: not a key of the config.
    _base_dir: Path = PrivateAttr(default=ROOT)

    @property
    def engine_front_ends(self) -> int:
        """The front ends of the core's one engine: the core's instances, and with entry: plain-core the plain
        model's too."""
        return self.core.front_ends + (self.generate.instances if self.entry == "plain-core" else 0)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @base_dir.setter
    def base_dir(self, folder: Path) -> None:
        self._base_dir = Path(folder)


def did_you_mean(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(str(key), options, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(options)}."


def parse_deployment(doc: Any) -> Deployment:
    """The raw (substituted) YAML document as a Deployment, or ConfigError with one line per problem."""
    if not isinstance(doc, dict):
        raise ConfigError(f"config: expected a mapping, got {type(doc).__name__}")
    try:
        return Deployment.model_validate(doc)
    except ValidationError as exc:
        missing = [str(e["loc"][-1]) for e in exc.errors() if e["type"] == "missing"]
        lines = [_message(error) for error in exc.errors() if error["type"] != "missing"]
        if missing:
            lines.insert(0, f"config: missing required key(s) {missing}; add them to the config")
        raise ConfigError("\n".join(dict.fromkeys(lines))) from None


# Expected type per pydantic error type, as the config's author would say it.
_EXPECTED = {
    "int_type": "int",
    "bool_type": "bool",
    "string_type": "str",
    "float_type": "float",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "list_type": "a list",
}


def _path(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "config"


def _shown(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"


def _message(error: Any) -> str:
    loc, kind, value = tuple(error["loc"]), error["type"], error.get("input")
    if loc and loc[-1] == "[key]":  # a mapping's key
        return f"{_path(loc[:-2])}: keys must be strings, got {loc[-2]!r}"
    where = _path(loc)
    if kind == "extra_forbidden":
        return f"{where}: unknown key; {did_you_mean(str(loc[-1]), _keys(_section_at(loc[:-1])))}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {_shown(value)}"
    if kind == "literal_error":
        expected = error["ctx"]["expected"].replace(" or ", ", ").replace("'", "")
        return f"{where}: must be one of {expected}, got {value!r}"
    if kind in ("greater_than_equal", "less_than_equal"):
        low, high = _bounds(_section_at(loc[:-1]), str(loc[-1]))
        rule = f"{value} is outside {low}..{high}" if None not in (low, high) else f"must be >= {low}"
        if high is not None and low is None:
            rule = f"must be <= {high}"
        hint = _hint(_section_at(loc[:-1]), str(loc[-1]))
        return f"{where}: {rule}" + (f" ({hint})" if hint else "")
    if kind == "value_error":
        return f"{where}: {error['ctx']['error']}"
    return f"{where}: {error['msg']}"  # anything else: pydantic's own words


def _section_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class of the section at a key path (None past a mapping or list of plain values)."""
    section: type[BaseModel] | None = Deployment
    for part in loc:
        if section is None or not isinstance(part, str):
            return None
        info = _field(section, part)
        section = _model_of(info.annotation) if info is not None else None
    return section


def _field(section: type[BaseModel], key: str) -> FieldInfo | None:
    for name, info in section.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model in a field's annotation: `Names`, or `ImagesConfig | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model_of, typing.get_args(annotation)) if m is not None]
        return models[0] if models else None
    return None


def _keys(section: type[BaseModel] | None) -> list[str]:
    return [info.alias or name for name, info in section.model_fields.items()] if section is not None else []


def _bounds(section: type[BaseModel] | None, key: str) -> tuple[Any, Any]:
    info = _field(section, key) if section is not None else None
    metadata = list(info.metadata) if info is not None else []
    if info is not None:  # bounds inside `Annotated[int, Field(ge=...)] | None` (ImagesConfig)
        for arg in typing.get_args(info.annotation):
            metadata += getattr(arg, "__metadata__", ())
    metadata = [m for item in metadata for m in (getattr(item, "metadata", None) or [item])]
    low = next((m.ge for m in metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in metadata if hasattr(m, "le")), None)
    return low, high


def _hint(section: type[BaseModel] | None, key: str) -> str | None:
    info = _field(section, key) if section is not None else None
    extra = info.json_schema_extra if info is not None else None
    return extra.get("hint") if isinstance(extra, dict) else None
