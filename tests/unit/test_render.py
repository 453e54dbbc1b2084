"""repo_render: the checked-in repository is its rendering; configs are validated before writing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repo_render import (
    DEFAULT_CONFIG,
    DEFAULT_OUT,
    ConfigError,
    drift,
    existing_files,
    load_deployment,
    main,
    render,
)


def test_checked_in_repository_is_the_rendering_of_the_default_config():
    files = render(load_deployment(DEFAULT_CONFIG), DEFAULT_OUT)
    assert drift(files, DEFAULT_OUT) == []
    assert main([str(DEFAULT_CONFIG), "--out", str(DEFAULT_OUT), "--check"]) == 0


def test_rendering_is_deterministic(tmp_path: Path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert main([str(DEFAULT_CONFIG), "--out", str(first)]) == 0
    assert main([str(DEFAULT_CONFIG), "--out", str(second)]) == 0
    read = lambda root: {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}  # noqa: E731
    assert read(first) == read(second)
    assert len(read(first)) == 17


def test_a_model_no_longer_rendered_leaves_no_folder(tmp_path: Path):
    """Re-rendering after a model's name changed removes the old model's folder, __pycache__ and all: tritonserver
    refuses to start on a model folder without a config ("Could not determine backend")."""
    out = tmp_path / "repo"
    assert main([str(DEFAULT_CONFIG), "--out", str(out)]) == 0
    (out / "generate" / "1" / "__pycache__").mkdir()  # what a server that ran the old model leaves behind
    (out / "generate" / "1" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"")
    (out / "keep_me").mkdir()  # a folder with no rendered file in it is not the renderer's to remove
    renamed = tmp_path / "renamed.yaml"
    doc = DEFAULT_CONFIG.read_text().replace("model: ../models/", f"model: {DEFAULT_CONFIG.parent.parent}/models/")
    renamed.write_text(
        doc.replace("  streaming: vllm_model_stream", "  streaming: vllm_model_stream\n  generate: generate_renamed")
    )
    assert main([str(renamed), "--out", str(out)]) == 0
    assert not (out / "generate").exists()
    assert (out / "generate_renamed" / "config.pbtxt").is_file() and (out / "keep_me").is_dir()
    assert main([str(renamed), "--out", str(out), "--check"]) == 0


def test_check_reports_drift(tmp_path: Path):
    out = tmp_path / "repo"
    assert main([str(DEFAULT_CONFIG), "--out", str(out)]) == 0
    (out / "vllm_core" / "1" / "model.json").write_text("{}\n")
    (out / "stray.txt").write_text("x")
    assert main([str(DEFAULT_CONFIG), "--out", str(out), "--check"]) == 1
    files = render(load_deployment(DEFAULT_CONFIG), out)
    assert sorted(drift(files, out)) == ["differs: vllm_core/1/model.json", "extra: stray.txt"]


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("model: ./m\nengin_args: {}\n", "engin_args: unknown key; did you mean 'engine_args'?"),
        ("model: ./m\npreprocess: {instances: two}\n", "preprocess.instances: expected int, got str 'two'"),
        ("model: ./m\npreprocess: {instances: true}\n", "preprocess.instances: expected int, got bool"),
        ("engine_args: {}\n", "config: missing required key(s) ['model']; add them"),
        ("model:\n", "model: expected str, got null"),
        ("model: ${MODEL_PATH}\n", "model: unresolved placeholder in '${MODEL_PATH}'; pass --set MODEL_PATH=VALUE"),
        (
            "model: ./m\nengine_args: {max_model_len: '${LEN}'}\n",
            "engine_args.max_model_len: unresolved placeholder in '${LEN}'; pass --set LEN=VALUE",
        ),
        (
            "model: ./m\npostprocess: {settings: {greeting: ['hi ${WHO}']}}\n",
            "postprocess.settings.greeting[0]: unresolved placeholder in 'hi ${WHO}'",
        ),
        ("model: ./m\nmetrics: 'yes'\n", "metrics: expected bool, got str 'yes'"),
        ("model: ./m\nmetric: true\n", "metric: unknown key; did you mean 'metrics'?"),
        (
            "model: ./m\nhealth: {restart_engin: true}\n",
            "health.restart_engin: unknown key; did you mean 'restart_engine'?",
        ),
        ("model: ./m\nhealth: {restart_engine: 'on'}\n", "health.restart_engine: expected bool, got str 'on'"),
        ("model: ./m\nhealth: {max_restarts: 2.5}\n", "health.max_restarts: expected int, got float 2.5"),
        ("model: ./m\nhealth: {max_restarts: 0}\n", "health.max_restarts: must be >= 1 (to never restart, set"),
        (
            "model: ./m\nhealth: {restart_backoff_seconds: true}\n",
            "health.restart_backoff_seconds: expected float, got bool True",
        ),
        ("model: ./m\nhealth: {restart_backoff_seconds: -1}\n", "restart_backoff_seconds: -1 is outside 0..3600"),
        ("model: ./m\ncore: {sender_threads: 65}\n", "core.sender_threads: 65 is outside 1..64"),
        ("model: ./m\nimages: {max_byte: 10}\n", "images.max_byte: unknown key; did you mean 'max_bytes'?"),
        ("model: ./m\nimages: {max_pixels: 1.5}\n", "images.max_pixels: expected int, got float 1.5"),
        ("model: ./m\nimages: {max_bytes: 0}\n", "images.max_bytes: must be >= 1"),
        ("model: ./m\nimages: {max_images: -1}\n", "images.max_images: must be >= 0"),
        # list[str] and nested sections: the key path, never a KeyError or pydantic's own report
        ("model: ./m\ncode_paths: [own, 3]\n", "code_paths[1]: expected str, got int 3"),
        ("model: ./m\ncode_paths: own\n", "code_paths: expected a list, got str 'own'"),
        ("model: ./m\nhealth: 3\n", "health: expected a mapping, got int 3"),
        ("model: ./m\npreprocess: {clas: raw}\n", "preprocess.clas: unknown key; did you mean 'class'?"),
        ("model: ./m\nentry: blss\n", "entry: must be one of ensemble, bls, plain-bls, plain-core, got 'blss'"),
        ("model: ./m\nchat_template: {inline: x, file: y}\n", "chat_template: give 'inline' (the template) or 'file'"),
        ("model: ./m\nchat_template: {file: nowhere.jinja}\n", "chat_template.file: no such file 'nowhere.jinja'"),
        ("model: ./m\nchat_template: {inline: 3}\n", "chat_template.inline: expected str, got int 3"),
        ("model: ./m\nlora_adapters: {a: 3}\n", "lora_adapters.a: expected str, got int 3"),
        (
            "model: ./m\nlora_adapters: {a: ./a}\n",
            "lora_adapters: vLLM serves adapters only with engine_args.enable_lora",
        ),
        ("model: ./m\nengine_args: {model: ./n}\n", "engine_args.model: set the model with the top-level 'model' key"),
        (
            "model: ./m\nengine_args: {max_model_length: 512}\n",
            "engine_args.max_model_length: not a vLLM AsyncEngineArgs field; did you mean 'max_model_len'?",
        ),
        (
            "model: ./m\nengine_args: {max_model_len: '512'}\n",
            "engine_args.max_model_len: vLLM expects int, got str '512'",
        ),
        ("model: ./m\nengine_args: {enforce_eager: 1}\n", "engine_args.enforce_eager: vLLM expects bool, got int 1"),
        ("model: ./m\nengine_args: {dtype: bf16}\n", "engine_args.dtype: vLLM expects Literal['auto', 'half', "),
        ("model: ./m\nnames: {plain: a/b}\n", "names.plain: 'a/b' is not a usable model name"),
        ("model: ./m\ngenerate: {max_in_flight: 0}\n", "generate.max_in_flight: must be >= 1"),
        ("model: ./m\npreprocess: {class: rawr}\n", "preprocess.class: 'rawr' is not a built-in preprocess"),
        ("model: ./m\npreprocess: {class: rawr}\n", "did you mean 'raw'?"),
        ("model: ./m\npostprocess: {class: open_ai}\n", "did you mean 'openai'?"),
        (
            "model: ./m\npreprocess: {class: raw}\nchat_template: {inline: x}\n",
            "chat_template: the raw preprocess takes the prompt text only (no chat template, no images)",
        ),
        ("model: ./m\npreprocess: {class: raw}\nimages: {max_images: 1}\n", "images: the raw preprocess takes"),
        (
            "model: ./m\npostprocess: {class: nowhere.module:Cls}\n",
            "postprocess.class: stage class 'nowhere.module:Cls'",
        ),
        ("- just a list\n", "config: expected a mapping, got list"),
        ("model: ./m\npostprocess: {instances: 0}\n", "postprocess.instances: must be >= 1"),
        ("model: ./m\npreprocess: {instances: 0}\n", "preprocess.instances: must be >= 1"),
        ("model: ./m\nnames: {plain: x, streaming: x}\n", "names: model names must differ, ['x'] used twice"),
        ("model: ./m\nnames: {core: preprocess}\n", "names: model names must differ, ['preprocess'] used twice"),
        # Stages that do not fit their neighbours or the ensembles (tests/support/custom_stages.py).
        (
            "model: ./m\npreprocess: {class: 'tests.support.custom_stages:NoEngineRequest'}\n",
            "preprocess.class: NoEngineRequest outputs ['prompt_ids'], but the core (vllm_core) consumes"
            " 'engine_request' (TYPE_STRING [1, 1]): the preprocess stage must output it",
        ),
        (
            "model: ./m\npreprocess: {class: 'tests.support.custom_stages:EngineRequestAsInts'}\n",
            "preprocess.class: EngineRequestAsInts outputs 'engine_request' as TYPE_INT32 [-1]; the core (vllm_core)"
            " takes TYPE_STRING [1, 1]",
        ),
        (
            "model: ./m\npreprocess: {class: 'tests.support.custom_stages:ExtraOutput'}\n",
            "preprocess.class: ExtraOutput outputs ['stream_flag'], which no step consumes",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:NeedsRequestInput'}\n",
            "postprocess.class: NeedsRequestInput needs ['stream'], which the core (vllm_core) does not produce",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:NeedsRequestInput'}\n",
            "(Triton refuses an ensemble step that mixes a decoupled step's outputs with other tensors at load time)",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:EngineResponseAsFloat'}\n",
            "postprocess.class: EngineResponseAsFloat takes 'engine_response' as TYPE_FP32 [1]; the core outputs"
            " TYPE_STRING [1, 1]",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:EchoesAnInput'}\n",
            "['text_input'] would be both an input and an output of the ensembles",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:Decoupled'}\n",
            "postprocess.class: Decoupled declares decoupled = True",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:TwiceTheSameOutput'}\n",
            "postprocess.class: TwiceTheSameOutput.outputs declares ['text_output'] more than once",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:UnknownDataType'}\n",
            "postprocess.class: UnknownDataType tensor 'score' has type 'TYPE_FP64'; use one of",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:NoOutputs'}\n",
            "postprocess.class: NoOutputs.outputs is empty",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:NotSpecs'}\n",
            "postprocess.class: NotSpecs.inputs must be a tuple of core.interface.TensorSpec",
        ),
        ("model: ./m\nengine_env: {A: 1}\n", "engine_env.A: expected str, got int 1"),
        ("model: ./m\nstream_interval_ms: 5000\n", "stream_interval_ms: 5000 is outside 0..1000"),
        (
            "model: ./m\nengine_env: {'BAD-NAME': '1'}\n",
            "engine_env.BAD-NAME: not an environment variable name",
        ),
        (
            "model: ./m\npostprocess: {class: 'tests.support.custom_stages:Missing'}\n",
            "module 'tests.support.custom_stages' has no attribute 'Missing'",
        ),
    ],
)
def test_config_errors_name_the_key_and_write_nothing(tmp_path: Path, capsys, text: str, message: str):
    out = tmp_path / "out"
    assert main([str(_config(tmp_path, text)), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_every_problem_of_a_config_is_reported_at_once(tmp_path: Path, capsys):
    text = "model: 3\nmetric: true\nhealth: {max_restarts: 0}\ncode_paths: [1]\n"
    with pytest.raises(ConfigError) as error:
        load_deployment(_config(tmp_path, text))
    assert sorted(str(error.value).splitlines()) == [
        "code_paths[0]: expected str, got int 1",
        "health.max_restarts: must be >= 1 (to never restart, set health.restart_engine: false)",
        "metric: unknown key; did you mean 'metrics'?",
        "model: expected str, got int 3",
    ]


def test_a_deployment_may_refuse_every_image(tmp_path: Path):
    """images.max_images: 0 is meaningful (a vision model served for text only); the stage's rule is the same."""
    from preprocess.images import ImageLimits

    files = render(load_deployment(_config(tmp_path, "model: ./m\nimages: {max_images: 0}\n")), tmp_path / "r")
    settings = json.loads(files["preprocess/1/stage.json"])["settings"]
    assert ImageLimits.from_settings(settings).max_images == 0
    with pytest.raises(ValueError, match="preprocess setting max_images: input should be greater than or equal to 0"):
        ImageLimits.from_settings({"max_images": -1})


def test_config_error_is_a_value_error_for_library_callers(tmp_path: Path):
    with pytest.raises(ConfigError):
        load_deployment(_config(tmp_path, "model: 3\n"))


def test_placeholders_resolve_from_set_with_their_yaml_type(tmp_path: Path):
    config = _config(
        tmp_path, "model: ${MODEL}\nengine_args: {max_model_len: '${LEN}'}\npreprocess: {instances: '${N}'}\n"
    )
    out = tmp_path / "out"
    assert main([str(config), "--out", str(out), "--set", "MODEL=org/name", "--set", "LEN=512", "--set", "N=2"]) == 0
    engine_args = json.loads((out / "vllm_core" / "1" / "model.json").read_text())
    assert engine_args == {"model": "org/name", "max_model_len": 512}
    assert "count: 2" in (out / "preprocess" / "config.pbtxt").read_text()


def test_dry_run_lists_the_files_and_writes_nothing(tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main([str(DEFAULT_CONFIG), "--out", str(out), "--dry-run"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [str(out / rel) for rel in render(load_deployment(DEFAULT_CONFIG), out)]
    assert not out.exists()


def test_builtin_stage_names_and_import_paths_render_the_same(tmp_path: Path):
    short = _config(tmp_path, "model: ./m\npreprocess: {class: raw}\npostprocess: {class: openai}\n")
    files = render(load_deployment(short), tmp_path / "out")
    assert json.loads(files["preprocess/1/stage.json"])["class"] == "preprocess.raw:RawPreprocessor"
    assert json.loads(files["postprocess/1/stage.json"])["class"] == "postprocess.openai:OpenAIPostprocessor"
    (tmp_path / "long").mkdir()
    full = _config(
        tmp_path / "long",
        "model: ../m\npreprocess: {class: 'preprocess.raw:RawPreprocessor'}\n"
        "postprocess: {class: 'postprocess.openai:OpenAIPostprocessor'}\n",
    )
    assert render(load_deployment(full), tmp_path / "out") == files
    # The OpenAI stage's one output replaces the vLLM backend's in both ensembles.
    for ensemble in ("vllm_model", "vllm_model_stream"):
        assert 'name: "chat_completion"' in files[f"{ensemble}/config.pbtxt"]
        assert 'name: "text_output"' not in files[f"{ensemble}/config.pbtxt"]


def test_top_level_keys_reach_the_stage_settings_and_core_parameters(tmp_path: Path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "chat.jinja").write_text("{{ messages }}")
    config = _config(
        tmp_path,
        "model: ./m\nchat_template: {file: templates/chat.jinja, allow_per_request: true}\n"
        "images: {max_bytes: 1000, max_pixels: 4096, max_images: 2}\nmetrics: false\n",
    )
    files = render(load_deployment(config), tmp_path / "repo")
    settings = json.loads(files["preprocess/1/stage.json"])["settings"]
    assert settings["chat_template_file"] == str(tmp_path / "templates" / "chat.jinja")  # outside a project
    assert settings["allow_request_chat_template"] is True
    assert (settings["max_image_bytes"], settings["max_image_pixels"], settings["max_images"]) == (1000, 4096, 2)
    core = json.loads(files["vllm_core/1/settings.json"])
    assert core["metrics"] is False
    # health left out: restart on, 3 restarts, 1 s backoff
    assert core["health"] == {"restart_engine": True, "max_restarts": 3, "restart_backoff_seconds": 1.0}
    health = "model: ./m\nhealth: {restart_engine: false, max_restarts: 5, restart_backoff_seconds: 2}\n"
    core = json.loads(render(load_deployment(_config(tmp_path, health)), tmp_path / "h")["vllm_core/1/settings.json"])
    assert core["health"] == {"restart_engine": False, "max_restarts": 5, "restart_backoff_seconds": 2.0}
    assert "parameters" not in files["vllm_core/config.pbtxt"]  # settings.json is the one place
    inline = render(load_deployment(_config(tmp_path, "model: ./m\nchat_template: {inline: 'T'}\n")), tmp_path / "r")
    settings = json.loads(inline["preprocess/1/stage.json"])["settings"]
    assert (settings["chat_template"], settings["allow_request_chat_template"]) == ("T", False)
    assert "chat_template_file" not in settings
    own = render(load_deployment(_config(tmp_path, "model: ./m\nchat_template: {allow_per_request: true}\n")), tmp_path)
    settings = json.loads(own["preprocess/1/stage.json"])["settings"]
    assert settings["allow_request_chat_template"] is True
    assert "chat_template" not in settings and "chat_template_file" not in settings


def test_rendered_files_are_ascii_so_the_stub_can_read_them(tmp_path: Path):
    """The 2.51 stub runs with LC_CTYPE=C: its Path.read_text() decodes ASCII only."""
    config = _config(
        tmp_path,
        "model: ./modèle\nchat_template: {inline: '{{ \"¡hola!\" }}'}\n"
        "postprocess: {class: 'tests.support.custom_stages:ShoutingPostprocessor', settings: {prefix: 'grüße 😀'}}\n",
    )
    files = render(load_deployment(config), tmp_path / "repo")
    for rel, text in files.items():
        assert text.isascii(), rel
    settings = json.loads(files["postprocess/1/stage.json"])["settings"]
    assert settings["prefix"] == "grüße 😀"
    assert json.loads(files["preprocess/1/stage.json"])["settings"]["chat_template"] == '{{ "¡hola!" }}'


def test_config_pbtxt_field_names_and_enum_values_are_checked_when_rendering():
    from google.protobuf.json_format import ParseError

    from repo_render.pbtxt import pbtxt

    assert pbtxt({"name": "m", "input": [{"name": "x", "data_type": "TYPE_FP16", "dims": [1]}]}) == (
        'name: "m"\ninput {\n  name: "x"\n  data_type: TYPE_FP16\n  dims: 1\n}\n'
    )
    with pytest.raises(ParseError, match="TYPE_FP128"):
        pbtxt({"name": "m", "input": [{"name": "x", "data_type": "TYPE_FP128"}]})
    with pytest.raises(ParseError, match="instance_groups"):
        pbtxt({"name": "m", "instance_groups": [{"count": 1}]})


def test_several_postprocess_instances_preserve_response_order(tmp_path: Path):
    one = render(load_deployment(_config(tmp_path, "model: ./m\npostprocess: {instances: 1}\n")), tmp_path / "a")
    assert "dynamic_batching" not in one["postprocess/config.pbtxt"]
    two = render(load_deployment(_config(tmp_path, "model: ./m\npostprocess: {instances: 2}\n")), tmp_path / "b")
    assert "dynamic_batching {\n  preserve_ordering: true\n}" in two["postprocess/config.pbtxt"]


def _paths(files: dict[str, str]) -> tuple[str, dict[str, str], str]:
    model = json.loads(files["vllm_core/1/model.json"])["model"]
    template = json.loads(files["preprocess/1/stage.json"])["settings"]["chat_template_file"]
    return model, json.loads(files["vllm_core/1/multi_lora.json"]), template


PATHS_CONFIG = (
    "model: ../models/m\nengine_args: {enable_lora: true}\nlora_adapters: {a: ../models/lora}\n"
    "chat_template: {file: chat.jinja}\n"
)


def test_local_paths_outside_the_outputs_project_are_absolute_unless_asked_relative(tmp_path: Path):
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "chat.jinja").write_text("{{ messages }}")
    config = _config(tmp_path / "deploy", PATHS_CONFIG)
    out = tmp_path / "elsewhere" / "repo"  # no .git above it: the repository can move on its own
    model, loras, template = _paths(render(load_deployment(config), out))
    assert (model, loras, template) == (
        str(tmp_path / "models" / "m"),
        {"a": str(tmp_path / "models" / "lora")},
        str(tmp_path / "deploy" / "chat.jinja"),
    )
    assert main([str(config), "--out", str(out), "--relative-model-paths"]) == 0
    model, loras, template = _paths(existing_files(out))
    assert (model, loras, template) == ("../../models/m", {"a": "../../models/lora"}, "../../deploy/chat.jinja")
    assert main([str(config), "--out", str(out), "--check"]) == 1  # the default form differs from the written one


def test_local_paths_inside_the_outputs_project_stay_relative(tmp_path: Path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)  # the marker of a project folder (a worktree's .git is a file: same)
    (project / "deploy").mkdir()
    (project / "deploy" / "chat.jinja").write_text("{{ messages }}")
    config = _config(project / "deploy", PATHS_CONFIG)
    model, loras, template = _paths(render(load_deployment(config), project / "out" / "repo"))
    assert (model, loras, template) == ("../../models/m", {"a": "../../models/lora"}, "../../deploy/chat.jinja")
    # A path inside the output itself is relative to it in any case.
    inside = render(load_deployment(_config(tmp_path, "model: ./repo/m\n")), tmp_path / "repo")
    assert json.loads(inside["vllm_core/1/model.json"])["model"] == "./m"


@pytest.mark.parametrize("item", ["MODEL", "=org/name"])
def test_a_set_without_name_and_value_is_a_usage_error(item: str, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--set", item])
    assert exited.value.code == 2 and "expected NAME=VALUE" in capsys.readouterr().err
