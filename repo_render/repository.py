"""Every file of a model repository from a validated deployment, and writing or comparing them on disk."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from core import interface as tensors
from core import vllm_defaults
from core.settings import (
    SETTINGS_FILE,
    STAGE_FILE,
    STAGES_FILE,
    CoreModelSettings,
    CoreSettings,
    EngineClients,
    EntrySettings,
    GenerateSettings,
    Settings,
)
from repo_render.pbtxt import HEADER, _ensemble, _python_model, _step
from repo_render.schema import BUILTIN_STAGES, BUILTIN_STAGES_PATHS, ROOT, STAGE_ROLES, ConfigError, Deployment
from repo_render.stages import check_wiring, code_dirs, load_stage, stage_path

# The most requests the core, or generate, takes in one execute: more than any engine batch (vLLM queues the rest
# itself).
INTAKE_MAX_BATCH_SIZE = 1024


def _model_py(adapter: str, role: str) -> str:
    return (
        HEADER
        + f'"""Triton adapter for {role}; the logic lives in core/ and the stage packages."""\n\n'
        + f"from core.triton_models import {adapter} as TritonPythonModel  # noqa: F401\n"
    )


def _json(doc: Any) -> str:
    # ASCII only (non-ASCII as \uXXXX escapes): the 2.51 Python-backend stub runs with LC_CTYPE=C, where the
    # adapters' Path.read_text() decodes as ASCII; a "ü" in stage.json made a model fail to load (found by
    # tests/integration/test_render_property.py).
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=True) + "\n"


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
        # vLLM's own defaults, read from vLLM here so that the preprocess stub never imports it
        "max_logprobs": engine_args.get("max_logprobs", vllm_defaults.max_logprobs()),
        "default_max_tokens": vllm_defaults.max_tokens(),
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
    files[f"{names.preprocess}/1/{STAGE_FILE}"] = _json(
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
    files[f"{names.postprocess}/1/{STAGE_FILE}"] = _json(
        _stage_spec(stage_path("postprocess", deployment.postprocess.cls), post_settings, code_paths)
    )

    core_io = ((tensors.ENGINE_REQUEST,), (tensors.ENGINE_RESPONSE,))
    # core.postprocess_in_sender: the core also gives the postprocess stage's outputs, which the streaming ensemble
    # asks for (BLS callers ask for ENGINE_RESPONSE); they are the ensemble's public, unbatched outputs, so the core
    # cannot batch its intake (docs/platform-notes.md T9).
    # core.preprocess_threads: the core also takes the preprocess stage's inputs (the ensemble's public ones), so
    # every input is optional: a BLS caller sends ENGINE_REQUEST, the streaming ensemble the public inputs.
    in_sender = deployment.core.postprocess_in_sender
    core_preprocesses = deployment.core.preprocess_threads > 0
    core_inputs = core_io[0]
    if core_preprocesses:
        core_inputs = tuple(replace(t, optional=True) for t in core_io[0] + pre_cls.inputs)
    files[f"{names.core}/config.pbtxt"] = _python_model(
        names.core,
        core_inputs,
        core_io[1] + (post_cls.outputs if in_sender else ()),
        # One engine, which spans the GPUs itself (tensor_parallel_size), hence KIND_MODEL as the vLLM backend; its
        # front ends (core/front_ends.py) are the instances.
        deployment.core.front_ends,
        "KIND_MODEL",
        decoupled=True,
        # Requests that arrive together enter the core in one execute (~1 ms round trip each on an H100 host;
        # a burst of 256 streams waited up to ~250 ms for it): docs/performance-gpu.md.
        max_batch_size=0 if in_sender or core_preprocesses else INTAKE_MAX_BATCH_SIZE,
    )
    # The stages the core runs itself: the same classes and settings as the stage models' stage.json
    in_core = [stage for stage, on in (("preprocess", core_preprocesses), ("postprocess", in_sender)) if on]
    if in_core:
        stages = {stage: json.loads(files[f"{getattr(names, stage)}/1/{STAGE_FILE}"]) for stage in in_core}
        files[f"{names.core}/1/{STAGES_FILE}"] = _json(stages)
    files[f"{names.core}/1/model.py"] = _model_py("CoreModel", "the vLLM core (decoupled, owns the engine)")
    files[f"{names.core}/1/model.json"] = _json(engine_args)
    if lora_paths:
        files[f"{names.core}/1/multi_lora.json"] = _json(lora_paths)
    if deployment.entry == "plain-core":
        files.update(_plain_core(deployment, files, pre_cls.inputs, post_cls.outputs))
    else:
        files[f"{names.core}/1/{SETTINGS_FILE}"] = _settings(core_settings(deployment))

    files[f"{names.generate}/config.pbtxt"] = _python_model(
        names.generate,
        *core_io,
        deployment.generate.instances,
        "KIND_CPU",
        # As the core: each execute only hands its requests to worker threads, but is a ~1 ms stub round trip; a burst
        # of 128 plain requests queued 8 ms each in front of 4 unbatched instances (H100, docs/performance-gpu.md).
        max_batch_size=INTAKE_MAX_BATCH_SIZE,
    )
    generate = GenerateSettings(core_model=names.core, max_in_flight=deployment.generate.max_in_flight)
    files[f"{names.generate}/1/{SETTINGS_FILE}"] = _settings(generate)
    files[f"{names.generate}/1/model.py"] = _model_py("GenerateModel", "generate (BLS over the core, one response)")

    if deployment.entry in ("bls", "plain-bls"):
        # The same classes and settings as the stage models' stage.json (one derivation, above).
        stages = {
            "preprocess": json.loads(files[f"{names.preprocess}/1/{STAGE_FILE}"]),
            "postprocess": json.loads(files[f"{names.postprocess}/1/{STAGE_FILE}"]),
        }
        entries = (
            ((names.plain, False),)
            if deployment.entry == "plain-bls"
            else ((names.plain, False), (names.streaming, True))
        )
        for entry, stream in entries:
            files[f"{entry}/config.pbtxt"] = _python_model(
                entry,
                pre_cls.inputs,
                post_cls.outputs,
                deployment.generate.instances,
                "KIND_CPU",
                decoupled=stream,
            )
            watch = deployment.entry == "bls"
            files[f"{entry}/1/{SETTINGS_FILE}"] = _settings(
                EntrySettings(**dict(generate), stream=stream, watch_cancels=watch)
            )
            files[f"{entry}/1/model.py"] = _model_py("EntryModel", "a public entry (stages in-process, core by BLS)")
            files[f"{entry}/1/{STAGES_FILE}"] = _json(stages)
        if deployment.entry == "bls":
            return dict(sorted(files.items()))

    request, response = "_" + tensors.ENGINE_REQUEST.name, "_" + tensors.ENGINE_RESPONSE.name
    public_in = {t.name: t.name for t in pre_cls.inputs}
    public_out = {t.name: t.name for t in post_cls.outputs}
    ensembles = ((names.plain, names.generate), (names.streaming, names.core))
    if deployment.entry in PLAIN_ENTRIES:  # its plain public model is rendered above
        ensembles = ensembles[1:]
    for ensemble, middle in ensembles:
        # The streaming ensemble leaves out the stages that the core runs itself.
        pre_in_core = core_preprocesses and middle == names.core
        post_in_core = in_sender and middle == names.core
        steps = [] if pre_in_core else [_step(names.preprocess, public_in, {tensors.ENGINE_REQUEST.name: request})]
        steps.append(
            _step(
                middle,
                public_in if pre_in_core else {tensors.ENGINE_REQUEST.name: request},
                public_out if post_in_core else {tensors.ENGINE_RESPONSE.name: response},
            )
        )
        if not post_in_core:
            steps.append(_step(names.postprocess, {tensors.ENGINE_RESPONSE.name: response}, public_out))
        files[f"{ensemble}/config.pbtxt"] = _ensemble(ensemble, pre_cls.inputs, post_cls.outputs, steps)
        files[f"{ensemble}/1/.keep"] = ""  # Triton needs a version folder, also for an ensemble
    uncalled = _uncalled_models(deployment)
    return dict(sorted((rel, text) for rel, text in files.items() if rel.split("/")[0] not in uncalled))


# The entries whose plain public model is one Python model and whose streaming one is the ensemble
PLAIN_ENTRIES = ("plain-bls", "plain-core")


def _plain_core(
    deployment: Deployment, files: dict[str, str], inputs: tuple[Any, ...], outputs: tuple[Any, ...]
) -> dict[str, str]:
    """entry: plain-core: the core's settings, and the plain public model as the core's adapter (not decoupled)
    whose generate.instances instances are front ends of the core's engine after the core's own."""
    names, core = deployment.names, deployment.core
    clients = deployment.engine_front_ends
    shared = core_settings(deployment).model_dump()
    core_model = CoreModelSettings(
        **shared, engine_clients=EngineClients(engine_model=names.core, first=0, total=clients)
    )
    plain_model = CoreModelSettings(
        **{
            **shared,
            "core": core.model_copy(
                update={"preprocess_threads": deployment.generate.preprocess_threads, "postprocess_in_sender": True}
            ).model_dump(),
        },
        engine_clients=EngineClients(engine_model=names.core, first=core.front_ends, total=clients),
        plain=True,
        watch_cancels=deployment.generate.watch_cancels,
    )
    # The same classes and settings as the stage models' stage.json (one derivation, above).
    stages = {stage: json.loads(files[f"{getattr(names, stage)}/1/{STAGE_FILE}"]) for stage in STAGE_ROLES}
    plain = {
        f"{names.plain}/config.pbtxt": _python_model(
            # KIND_MODEL as the core: the same adapter, a client of the engine that spans the GPUs itself
            names.plain,
            inputs,
            outputs,
            deployment.generate.instances,
            "KIND_MODEL",
        ),
        f"{names.plain}/1/model.py": _model_py("CoreModel", "the plain public model (the core's adapter, plain)"),
        f"{names.plain}/1/model.json": files[f"{names.core}/1/model.json"],
        f"{names.plain}/1/{SETTINGS_FILE}": _settings(plain_model),
        f"{names.plain}/1/{STAGES_FILE}": _json(stages),
        f"{names.core}/1/{SETTINGS_FILE}": _settings(core_model),
    }
    if f"{names.core}/1/multi_lora.json" in files:
        plain[f"{names.plain}/1/multi_lora.json"] = files[f"{names.core}/1/multi_lora.json"]
    return plain


def _uncalled_models(deployment: Deployment) -> set[str]:
    """Models that no public model calls, left out of the repository: with entry: plain-bls or plain-core,
    generate, and a stage model whose stage the core runs itself for the streaming ensemble (each would be
    instances doing nothing)."""
    if deployment.entry not in PLAIN_ENTRIES:
        return set()
    names, core = deployment.names, deployment.core
    in_core = ((names.preprocess, core.preprocess_threads > 0), (names.postprocess, core.postprocess_in_sender))
    return {names.generate} | {stage for stage, runs_in_core in in_core if runs_in_core}


def render_together(deployments: list[Deployment], out: Path) -> dict[str, str]:
    """Every file of one repository that serves several deployments (each with model names of its own): a
    deployment variant served beside another by one server. Two that share a model folder are refused."""
    files: dict[str, str] = {}
    for deployment in deployments:
        rendered = render(deployment, out)
        shared = sorted({rel.split("/")[0] for rel in set(rendered) & set(files)})
        if shared:
            raise ConfigError(f"names: models of the same names in two deployments: {', '.join(shared)}; rename them")
        files.update(rendered)
    return files


def core_settings(deployment: Deployment) -> CoreSettings:
    """What the core's adapter reads (settings.json): the deployment's keys of the same names (a Deployment is a
    CoreSettings with more keys)."""
    return CoreSettings.model_validate(deployment.model_dump(include=set(CoreSettings.model_fields)))


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
    _remove_emptied_folders(out, stale)
    for rel, text in files.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)


def _remove_emptied_folders(out: Path, stale: set[str]) -> None:
    """The folders that removing stale files left empty (a model no longer rendered), deepest first: tritonserver
    refuses to start on a model folder without a config ("Could not determine backend"). Python's __pycache__ left
    by a server that ran the old model does not keep a folder."""
    folders = {
        parent for rel in stale for parent in (out / rel).parents if parent.is_relative_to(out) and parent != out
    }
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        if not folder.is_dir():
            continue
        children = list(folder.iterdir())
        if all(child.name == "__pycache__" and child.is_dir() for child in children):
            for child in children:
                shutil.rmtree(child)
            folder.rmdir()


def drift(files: dict[str, str], out: Path) -> list[str]:
    current = existing_files(out)
    problems = [f"missing: {rel}" for rel in files if rel not in current]
    problems += [f"differs: {rel}" for rel in files if rel in current and current[rel] != files[rel]]
    problems += [f"extra: {rel}" for rel in current if rel not in files]
    return problems
