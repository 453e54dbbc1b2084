"""Property: every valid deployment config renders to a tree that tritonserver accepts.

Many random valid configs are rendered and each tree is checked the way Triton checks it at load time (every
config.pbtxt parses as Triton's ModelConfig protobuf, every ensemble's wiring is complete, typed and obeys
docs/platform-notes.md T1-T2); a few sampled configs are then loaded for real by one tritonserver, and each of
their public models answers a request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from repo_render import load_deployment, render
from tests.support.deployment_helpers import render_together, start_server, with_own_internal_names
from tests.support.triton_helpers import http_generate, sse_events
from tools.build_tiny_lora import DEFAULT_OUT as TINY_LORA
from tools.build_tiny_lora import build as build_tiny_lora
from tools.build_tiny_model import CHAT_TEMPLATE
from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL

PREPROCESS = st.sampled_from(["default", "raw", "preprocess.default:Preprocessor", "preprocess.raw:RawPreprocessor"])
POSTPROCESS = st.sampled_from(["vllm_backend", "openai", "postprocess.openai:OpenAIPostprocessor"])
MODEL_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


@st.composite
def deployments(draw: st.DrawFn, runnable: bool = False) -> dict[str, Any]:
    """A valid deployment config (as the YAML document); `runnable`: the tiny model, servable on CPU."""
    engine_args: dict[str, Any] = {
        "enforce_eager": True,
        "max_model_len": draw(st.sampled_from([256, 512])),
        "kv_cache_memory_bytes": 128 << 20,
        "gpu_memory_utilization": 0.05,  # on a GPU, several of the suite's engines share it (vLLM on CPU ignores it)
        "disable_log_stats": draw(st.booleans()),
        "max_num_seqs": draw(st.integers(1, 64)),
        "seed": draw(st.integers(0, 2**16)),
    }
    config: dict[str, Any] = {
        "model": str(TINY_MODEL) if runnable else draw(st.sampled_from([str(TINY_MODEL), "./m", "org/model-7b"])),
        "engine_args": engine_args,
        "preprocess": {"class": draw(PREPROCESS), "instances": draw(st.integers(1, 3))},
        "postprocess": {"class": draw(POSTPROCESS)},
        "generate": {"instances": draw(st.integers(1, 2)), "max_in_flight": draw(st.integers(1, 600))},
        "metrics": draw(st.booleans()),
        # the streaming ensemble's stages in the core (its threads, its sender): fewer steps, the core unbatched
        "core": {"postprocess_in_sender": draw(st.booleans()), "preprocess_threads": draw(st.integers(0, 2))},
        "health": {
            "restart_engine": draw(st.booleans()),
            "max_restarts": draw(st.integers(1, 10)),
            "restart_backoff_seconds": draw(st.sampled_from([0, 0.5, 1.0, 30])),
        },
    }
    if draw(st.booleans()):
        config["postprocess"] = {
            "class": "tests.support.custom_stages:ShoutingPostprocessor",
            "settings": {"prefix": draw(st.text(max_size=8))},
        }
    if draw(st.booleans()):
        names = draw(st.lists(MODEL_NAME, min_size=6, max_size=6, unique=True))
        config["names"] = dict(
            zip(["plain", "streaming", "core", "generate", "preprocess", "postprocess"], names, strict=True)
        )
    chat_aware = "raw" not in config["preprocess"]["class"]  # the raw preprocess takes no template, no images
    if chat_aware and draw(st.booleans()):
        config["chat_template"] = {"inline": CHAT_TEMPLATE, "allow_per_request": draw(st.booleans())}
    if chat_aware and draw(st.booleans()):
        config["images"] = {
            key: draw(st.integers(1, 1 << 24)) for key in draw(st.sets(st.sampled_from(["max_bytes", "max_pixels"])))
        }
    if draw(st.booleans()):
        engine_args.update(enable_lora=True, max_loras=2, max_lora_rank=8)
        config["lora_adapters"] = {"tiny-lora": str(TINY_LORA)}
    return config


def _load(config: dict[str, Any], folder: Path):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "deployment.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return load_deployment(path)


def _shape(model, tensor) -> tuple[int, list[int]]:
    """A model tensor's type and full shape as the ensemble passes it: a batching model's (max_batch_size > 0)
    has the batch dimension first, one request per ensemble step."""
    return tensor.data_type, ([1] if model.max_batch_size > 0 else []) + list(tensor.dims)


def check_tree_as_triton_would(files: dict[str, str]) -> None:
    configs = {}
    for rel, text in files.items():
        if rel.endswith("/config.pbtxt"):
            config = text_format.Parse(text, model_config_pb2.ModelConfig())  # raises on any unknown field
            assert config.name == rel.split("/")[0], rel
            configs[config.name] = config
    for name, config in configs.items():
        assert any(rel.startswith(f"{name}/1/") for rel in files), f"{name}: no version folder"
        if config.backend == "python":
            assert f"{name}/1/model.py" in files
            continue
        assert config.platform == "ensemble", name
        assert not config.model_transaction_policy.decoupled
        tensors = {t.name: (t.data_type, list(t.dims)) for t in config.input}
        origin: dict[str, str | None] = dict.fromkeys(tensors)  # the decoupled model a tensor comes from
        for step in config.ensemble_scheduling.step:
            model = configs[step.model_name]
            inputs = {t.name: t for t in model.input}
            assert set(step.input_map) <= set(inputs), f"{name}: {step.model_name} has no input {set(step.input_map)}"
            missing = {n for n, t in inputs.items() if not t.optional} - set(step.input_map)
            assert not missing, f"{name}: {step.model_name} is not fed {missing}"
            for key, tensor in step.input_map.items():
                assert tensor in tensors, f"{name}: {tensor} is consumed before it is produced"
                assert tensors[tensor] == _shape(model, inputs[key]), f"{name}: {key} type"
            sources = {origin[t] for t in step.input_map.values()}
            rule = "docs/platform-notes.md T2"
            assert len(sources) == 1, f"{name}: {step.model_name} mixes tensors of {sources} ({rule})"
            source = model.name if model.model_transaction_policy.decoupled else sources.pop()
            outputs = {t.name: t for t in model.output}
            for key, tensor in step.output_map.items():
                assert key in outputs and tensor not in tensors, f"{name}: {tensor} produced twice or unknown"
                tensors[tensor] = _shape(model, outputs[key])
                origin[tensor] = source
        for output in config.output:
            assert tensors.get(output.name) == (output.data_type, list(output.dims)), f"{name}: {output.name}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=deployments())
def test_random_valid_configs_render_to_trees_triton_accepts(tmp_path: Path, config: dict[str, Any]):
    deployment = _load(config, tmp_path / "config")
    files = render(deployment, tmp_path / "repo")
    assert render(deployment, tmp_path / "repo") == files  # deterministic
    check_tree_as_triton_would(files)
    assert len([rel for rel in files if rel.endswith("config.pbtxt")]) == 6
    engine_args = json.loads(next(text for rel, text in files.items() if rel.endswith("/1/model.json")))
    assert {k: v for k, v in engine_args.items() if k != "model"} == config["engine_args"]


SAMPLED = 3


def _diverse(configs: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` configs, preferring stage combinations not picked yet (so one server start covers more)."""
    picked: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for config in configs:
        combination = (config["preprocess"]["class"], config["postprocess"]["class"])
        if combination not in seen:
            seen.add(combination)
            picked.append(config)
    return (picked + [c for c in configs if c not in picked])[:count]


@pytest.mark.server
@pytest.mark.timeout(1800)
def test_sampled_configs_load_in_tritonserver_and_answer(tmp_path_factory: pytest.TempPathFactory):
    drawn: list[dict[str, Any]] = []

    # Hypothesis draws the candidates (its first draw is the minimal config; later ones vary every key).
    @settings(max_examples=40, deadline=None, phases=[Phase.generate], database=None)
    @given(config=deployments(runnable=True))
    def draw(config: dict[str, Any]) -> None:
        drawn.append(config)

    draw()
    build_tiny_lora()
    workdir = tmp_path_factory.mktemp("property")
    loaded = []
    for index, config in enumerate(_diverse(drawn[1:], SAMPLED)):
        config["names"] = {"plain": f"d{index}_plain", "streaming": f"d{index}_stream"}  # one repository for all
        loaded.append(with_own_internal_names(_load(config, workdir / f"config{index}")))
    repository = workdir / "repository"
    check_tree_as_triton_would(render_together(loaded, repository))
    print("sampled deployments:", *loaded, sep="\n")  # shown by pytest when the test fails
    server = start_server(repository, workdir / "tritonserver.log")
    try:
        for deployment in loaded:
            output = "chat_completion" if "openai" in deployment.postprocess.cls else "text_output"
            payload = {"text_input": "Once upon a time", "parameters": {"temperature": 0, "max_tokens": 4}}
            reply = http_generate(server.http_url, payload, model=deployment.names.plain)
            assert reply.status_code == 200, (deployment, reply.text)
            assert reply.json()[output]
            events = sse_events(server.http_url, {**payload, "stream": True}, model=deployment.names.streaming)
            assert events and all(output in event for event in events), (deployment, events)
    finally:
        server.stop()


def test_the_tree_check_fails_on_wiring_triton_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The checker above is not vacuous: without the renderer's own wiring check, a postprocess that needs a
    request tensor renders to a tree it rejects, and so does feeding that tensor from the request."""
    import repo_render.repository

    monkeypatch.setattr(repo_render.repository, "check_wiring", lambda *args: None)
    config = {"model": "./m", "postprocess": {"class": "tests.support.custom_stages:NeedsRequestInput"}}
    files = render(_load(config, tmp_path), tmp_path / "repo")
    with pytest.raises(AssertionError, match=r"postprocess is not fed \{'stream'\}"):
        check_tree_as_triton_would(files)

    # Wire it from the request as well: the step after the decoupled core then mixes origins (rule 2.2).
    stream_config = text_format.Parse(files["vllm_model_stream/config.pbtxt"], model_config_pb2.ModelConfig())
    stream_config.ensemble_scheduling.step[2].input_map["stream"] = "stream"
    files["vllm_model_stream/config.pbtxt"] = text_format.MessageToString(stream_config)
    files.pop("vllm_model/config.pbtxt")  # the plain ensemble (no decoupled step) is not the point here
    mixed = r"vllm_model_stream: postprocess mixes tensors .* \(docs/platform-notes.md T2\)"
    with pytest.raises(AssertionError, match=mixed):
        check_tree_as_triton_would(files)
