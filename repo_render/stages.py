"""Stage classes: importing them as the served stub will, and checking the ensembles' wiring between them."""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from core import interface as tensors
from core.interface import NUMPY_DTYPES, TensorSpec
from core.stage import load_stage_class
from repo_render.schema import BUILTIN_STAGES, ROOT, ConfigError, Deployment, Names, did_you_mean


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
        f"{did_you_mean(value, list(builtin))} Or give your own class as 'package.module:ClassName'."
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
    """The ensembles' wiring, as Triton would check it at load time (and docs/platform-notes.md T1-T2)."""
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
