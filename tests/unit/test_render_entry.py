"""repo_render `entry`: "bls" renders Python entry models (so a client's cancel reaches the engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from core.settings import CoreModelSettings, EngineClients
from repo_render import DEFAULT_CONFIG, ConfigError, load_deployment, render


def _config(tmp_path: Path, **changes: object) -> Path:
    doc = yaml.safe_load(DEFAULT_CONFIG.read_text())
    doc.update(changes)
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_bls_entry_renders_python_entries_with_their_stages(tmp_path: Path):
    files = render(load_deployment(_config(tmp_path, entry="bls")), tmp_path / "out")
    for name, decoupled in (("vllm_model", False), ("vllm_model_stream", True)):
        config = files[f"{name}/config.pbtxt"]
        assert 'backend: "python"' in config and "ensemble_scheduling" not in config
        assert ("decoupled: true" in config) == decoupled
        assert "EntryModel" in files[f"{name}/1/model.py"]
        stages = json.loads(files[f"{name}/1/stages.json"])
        assert stages["preprocess"]["class"] == "preprocess.default:Preprocessor"
        assert stages["postprocess"]["class"] == "postprocess.vllm_backend:VllmBackendPostprocessor"


def test_plain_bls_entry_renders_the_plain_entry_beside_the_streaming_ensemble(tmp_path: Path):
    """entry: plain-bls: the plain public model is an entry model without the cancel watch (the stages in-process, the
    core by BLS), the streaming one the ensemble; no model is rendered that nothing calls; several front ends go."""
    fronts = {"front_ends": 2, "postprocess_in_sender": True}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    doc = _config(tmp_path, entry="plain-bls", core=fronts, engine_env=env, health={"restart_engine": False})
    files = render(load_deployment(doc), tmp_path / "out")
    plain = files["vllm_model/config.pbtxt"]
    assert 'backend: "python"' in plain and "ensemble_scheduling" not in plain and "decoupled: true" not in plain
    assert "EntryModel" in files["vllm_model/1/model.py"]
    settings = json.loads(files["vllm_model/1/settings.json"])
    assert settings["stream"] is False and settings["watch_cancels"] is False and settings["core_model"] == "vllm_core"
    assert set(json.loads(files["vllm_model/1/stages.json"])) == {"preprocess", "postprocess"}
    stream = files["vllm_model_stream/config.pbtxt"]
    assert 'platform: "ensemble"' in stream and 'model_name: "preprocess"' in stream
    assert 'model_name: "vllm_core"' in stream and 'model_name: "postprocess"' not in stream
    models = {rel.split("/")[0] for rel in files}
    assert models == {"vllm_model", "vllm_model_stream", "preprocess", "vllm_core"}  # no generate, no postprocess
    bls = render(load_deployment(_config(tmp_path, entry="bls")), tmp_path / "bls")
    assert json.loads(bls["vllm_model/1/settings.json"])["watch_cancels"] is True
    assert json.loads(bls["vllm_model_stream/1/settings.json"])["watch_cancels"] is True


def test_plain_core_entry_renders_the_core_adapter_as_the_plain_model(tmp_path: Path):
    """entry: plain-core: the plain public model is the core's adapter, not decoupled, with the stages in-process;
    its instances are front ends of the core's engine after the core's own (the core launches it for all of them);
    the streaming one stays the ensemble; nothing uncalled is rendered."""
    fronts = {"front_ends": 2, "postprocess_in_sender": True}
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    generate = {"instances": 3, "preprocess_threads": 5}
    doc = _config(
        tmp_path, entry="plain-core", core=fronts, engine_env=env, health={"restart_engine": False}, generate=generate
    )
    files = render(load_deployment(doc), tmp_path / "out")
    plain = files["vllm_model/config.pbtxt"]
    assert 'backend: "python"' in plain and "ensemble_scheduling" not in plain and "decoupled: true" not in plain
    assert "count: 3" in plain and "KIND_MODEL" in plain and "max_batch_size" not in plain
    assert 'name: "text_input"' in plain and 'name: "text_output"' in plain and "engine_request" not in plain
    assert "CoreModel" in files["vllm_model/1/model.py"]
    assert files["vllm_model/1/model.json"] == files["vllm_core/1/model.json"]
    settings = json.loads(files["vllm_model/1/settings.json"])
    assert settings["plain"] is True
    assert settings["engine_clients"] == {"engine_model": "vllm_core", "first": 2, "total": 5}
    assert settings["core"]["preprocess_threads"] == 5 and settings["core"]["postprocess_in_sender"] is True
    core = json.loads(files["vllm_core/1/settings.json"])
    assert core["plain"] is False and core["engine_clients"] == {"engine_model": "vllm_core", "first": 0, "total": 5}
    # what the adapters make of them: the plain model serves the core's engine; a core without them, its own
    plain_settings = CoreModelSettings.model_validate_json(files["vllm_model/1/settings.json"])
    assert plain_settings.clients_of("vllm_model") == EngineClients(engine_model="vllm_core", first=2, total=5)
    own = CoreModelSettings(core={"front_ends": 2}, health={"restart_engine": False})
    assert own.clients_of("vllm_core") == EngineClients(engine_model="vllm_core", first=0, total=2)
    assert core["core"]["preprocess_threads"] == 0  # the streaming ensemble keeps its preprocess model
    stages = json.loads(files["vllm_model/1/stages.json"])
    # the same stages as the preprocess model's and the core's (which runs the postprocess in its senders)
    assert stages == {
        "preprocess": json.loads(files["preprocess/1/stage.json"]),
        "postprocess": json.loads(files["vllm_core/1/stages.json"])["postprocess"],
    }
    assert stages["postprocess"]["class"] == "postprocess.vllm_backend:VllmBackendPostprocessor"
    stream = files["vllm_model_stream/config.pbtxt"]
    assert 'platform: "ensemble"' in stream and 'model_name: "vllm_core"' in stream
    assert {rel.split("/")[0] for rel in files} == {"vllm_model", "vllm_model_stream", "preprocess", "vllm_core"}


def test_plain_core_entry_shares_the_engine_so_it_cannot_restart_it(tmp_path: Path):
    """With entry: plain-core the engine always has several front ends (the plain model's instances), even with one
    core instance: the shared-engine rules apply, named for the entry."""
    with pytest.raises(ConfigError, match="entry: plain-core shares one engine .* health.restart_engine: false"):
        load_deployment(_config(tmp_path, entry="plain-core", engine_env={}))
    with pytest.raises(ConfigError, match="entry: plain-core needs vLLM's EngineCore in its own process"):
        load_deployment(_config(tmp_path, entry="plain-core", health={"restart_engine": False}))
    ok = load_deployment(_config(tmp_path, entry="plain-core", engine_env={}, health={"restart_engine": False}))
    assert ok.entry == "plain-core" and ok.generate.preprocess_threads == 4


def test_unknown_entry_kind_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="entry: must be one of ensemble, bls, plain-bls"):
        load_deployment(_config(tmp_path, entry="sidecar"))


def test_postprocess_in_sender_makes_the_streaming_ensemble_preprocess_then_core(tmp_path: Path):
    """core.postprocess_in_sender: the core gives the postprocess stage's outputs to the streaming ensemble (so it
    cannot batch: they are unbatched) and keeps ENGINE_RESPONSE for generate; the plain ensemble is unchanged."""
    plain = render(load_deployment(_config(tmp_path)), tmp_path / "plain")
    files = render(load_deployment(_config(tmp_path, core={"postprocess_in_sender": True})), tmp_path / "fused")
    stream = files["vllm_model_stream/config.pbtxt"]
    assert stream.count("step {") == 2 and 'model_name: "postprocess"' not in stream
    assert 'model_name: "vllm_core"' in stream and 'key: "text_output"' in stream
    core = files["vllm_core/config.pbtxt"]
    assert "max_batch_size" not in core and "dynamic_batching" not in core  # 0: Triton's text format omits it
    assert 'name: "engine_response"' in core and 'name: "text_output"' in core and 'name: "prompt_logprobs"' in core
    postprocess = json.loads(files["postprocess/1/stage.json"])
    assert json.loads(files["vllm_core/1/stages.json"]) == {"postprocess": postprocess}
    assert json.loads(files["vllm_core/1/settings.json"])["core"]["postprocess_in_sender"] is True
    assert files["vllm_model/config.pbtxt"] == plain["vllm_model/config.pbtxt"]  # pre -> generate -> post
    assert files["postprocess/config.pbtxt"] == plain["postprocess/config.pbtxt"]
    assert "max_batch_size: 1024" in plain["vllm_core/config.pbtxt"] and "vllm_core/1/stages.json" not in plain


def test_postprocess_in_sender_with_a_bls_entry_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="core.postprocess_in_sender does not work with entry: bls"):
        load_deployment(_config(tmp_path, entry="bls", core={"postprocess_in_sender": True}))


def test_preprocess_threads_make_the_streaming_ensemble_the_core_alone(tmp_path: Path):
    """core.preprocess_threads (with postprocess_in_sender): the streaming ensemble is one step, the core, which
    takes the public inputs (every one optional: generate still sends ENGINE_REQUEST) and runs both stages."""
    plain = render(load_deployment(_config(tmp_path)), tmp_path / "plain")
    both = {"preprocess_threads": 3, "postprocess_in_sender": True}
    files = render(load_deployment(_config(tmp_path, core=both)), tmp_path / "fused")
    stream = files["vllm_model_stream/config.pbtxt"]
    assert stream.count("step {") == 1 and 'model_name: "vllm_core"' in stream
    assert 'key: "text_input"' in stream and 'key: "text_output"' in stream
    core = files["vllm_core/config.pbtxt"]
    assert "max_batch_size" not in core and "dynamic_batching" not in core
    inputs = core.split("output {")[0]
    for name in ("engine_request", "text_input", "messages", "sampling_parameters", "stream"):
        assert f'name: "{name}"' in inputs
    assert inputs.count("input {") == inputs.count("optional: true")
    stages = json.loads(files["vllm_core/1/stages.json"])
    assert stages == {
        "preprocess": json.loads(files["preprocess/1/stage.json"]),
        "postprocess": json.loads(files["postprocess/1/stage.json"]),
    }
    assert files["vllm_model/config.pbtxt"] == plain["vllm_model/config.pbtxt"]  # pre -> generate -> post


def test_preprocess_threads_alone_make_the_streaming_ensemble_core_then_postprocess(tmp_path: Path):
    files = render(load_deployment(_config(tmp_path, core={"preprocess_threads": 1})), tmp_path / "out")
    stream = files["vllm_model_stream/config.pbtxt"]
    assert stream.count("step {") == 2 and 'model_name: "preprocess"' not in stream
    assert stream.index('model_name: "vllm_core"') < stream.index('model_name: "postprocess"')
    assert list(json.loads(files["vllm_core/1/stages.json"])) == ["preprocess"]
    assert 'name: "text_output"' not in files["vllm_core/config.pbtxt"]  # the core gives ENGINE_RESPONSE only


def test_plain_core_takes_the_core_stages_for_its_streaming_ensemble(tmp_path: Path):
    """entry: plain-core's streaming model is the ensemble, so core.preprocess_threads makes it the core alone as
    with entry: ensemble; the plain model keeps its own preprocess threads (generate.preprocess_threads)."""
    core = {"front_ends": 2, "postprocess_in_sender": True, "preprocess_threads": 2}
    doc = _config(
        tmp_path,
        entry="plain-core",
        core=core,
        engine_env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        health={"restart_engine": False},
    )
    files = render(load_deployment(doc), tmp_path / "out")
    stream = files["vllm_model_stream/config.pbtxt"]
    assert stream.count("step {") == 1 and 'model_name: "vllm_core"' in stream
    assert json.loads(files["vllm_core/1/settings.json"])["core"]["preprocess_threads"] == 2
    assert json.loads(files["vllm_model/1/settings.json"])["core"]["preprocess_threads"] == 4
    assert {rel.split("/")[0] for rel in files} == {"vllm_model", "vllm_model_stream", "vllm_core"}


def test_preprocess_threads_with_a_bls_entry_are_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="core.preprocess_threads does not work with entry: bls"):
        load_deployment(_config(tmp_path, entry="bls", core={"preprocess_threads": 2}))


def test_plain_core_watches_cancels_in_its_plain_model_only_when_asked(tmp_path: Path):
    """generate.watch_cancels: the plain model (the client's own) probes its requests for the client's cancel; the
    core's requests are ensemble steps, where a cancel never shows, so the core never probes. Off by default."""
    shared = {"entry": "plain-core", "engine_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}
    shared["health"] = {"restart_engine": False}
    watched = render(
        load_deployment(_config(tmp_path, **shared, generate={"watch_cancels": True})), tmp_path / "watched"
    )
    plain = CoreModelSettings.model_validate_json(watched["vllm_model/1/settings.json"])
    core = CoreModelSettings.model_validate_json(watched["vllm_core/1/settings.json"])
    assert plain.plain and plain.watch_cancels and not core.watch_cancels
    unwatched = render(load_deployment(_config(tmp_path, **shared)), tmp_path / "unwatched")
    assert not CoreModelSettings.model_validate_json(unwatched["vllm_model/1/settings.json"]).watch_cancels
    with pytest.raises(ValueError, match="watch_cancels is the plain model's"):  # the core's settings cannot ask
        CoreModelSettings(watch_cancels=True)


@pytest.mark.parametrize("entry", ["ensemble", "plain-bls", "bls"])
def test_watch_cancels_outside_plain_core_is_refused(tmp_path: Path, entry: str):
    expected = f"generate.watch_cancels works with entry: plain-core only \\(entry: {entry}"
    with pytest.raises(ConfigError, match=expected):
        load_deployment(_config(tmp_path, entry=entry, generate={"watch_cancels": True}))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"entry": "bls"},
        {"entry": "plain-bls", "core": {"front_ends": 2, "postprocess_in_sender": True}},
        {"entry": "plain-core", "core": {"front_ends": 2, "postprocess_in_sender": True}},
        {"entry": "plain-core", "core": {"front_ends": 1, "preprocess_threads": 2, "postprocess_in_sender": True}},
    ],
)
def test_the_public_models_are_found_from_the_configs_for_every_entry(tmp_path: Path, changes: dict[str, object]):
    """tools/serve.py sends its first request to the plain public model that tools/triton_server.py finds in the
    server's configs: for every entry the two public names, never an internal model."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    from tools.triton_server import public_models_of

    shared = {"engine_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, "health": {"restart_engine": False}}
    files = render(load_deployment(_config(tmp_path, **shared, **changes)), tmp_path / "out")
    configs = {  # as Triton serves them at /v2/models/NAME/config
        rel.split("/")[0]: json_format.MessageToDict(
            text_format.Parse(text, model_config_pb2.ModelConfig()), preserving_proto_field_name=True
        )
        for rel, text in files.items()
        if rel.endswith("/config.pbtxt")
    }
    assert len(configs) > 2
    assert public_models_of(configs) == {"vllm_model": False, "vllm_model_stream": True}
