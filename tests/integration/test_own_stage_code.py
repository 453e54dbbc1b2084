"""A deployment's own stage code from a folder outside this project (`code_paths`): what the renderer checks and
writes, and a real tritonserver serving such a stage through an ensemble and through the BLS entry."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.stage import load_stage_class
from repo_render import ConfigError, load_deployment, main, render
from tests.support.deployment_helpers import (
    own_deployment,
    render_together,
    start_server,
    with_own_internal_names,
    write_own_code,
)
from tests.support.triton_helpers import grpc_infer, sse_events

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0, "max_tokens": 12}

# Rendering -------------------------------------------------------------------------------------------------


def test_the_stage_json_of_an_own_class_carries_its_code_paths(tmp_path: Path):
    config = own_deployment(tmp_path, "./m")
    files = render(load_deployment(config), tmp_path / "out" / "repo")
    post = json.loads(files["postprocess/1/stage.json"])
    assert post["class"] == "shouting.stage:Shout"
    assert post["code_paths"] == [str(tmp_path / "own_code")]  # outside a project: absolute, like the model
    assert "code_paths" not in json.loads(files["preprocess/1/stage.json"])  # the built-in stage gets none
    relative = render(load_deployment(config), tmp_path / "out" / "repo", relative_paths=True)
    assert json.loads(relative["postprocess/1/stage.json"])["code_paths"] == ["../../own_code"]


def test_the_bls_entry_carries_the_code_paths_too(tmp_path: Path):
    files = render(load_deployment(own_deployment(tmp_path, "./m", entry="bls")), tmp_path / "repo")
    for entry in ("vllm_model", "vllm_model_stream"):
        stages = json.loads(files[f"{entry}/1/stages.json"])
        assert stages["postprocess"]["code_paths"] == [str(tmp_path / "own_code")]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda text: text.replace("[../own_code]", "[../no_such_folder]"),
            "code_paths[0]: no such folder '../no_such_folder' (relative to the config file's folder, or absolute)",
        ),
        (
            lambda text: text.replace("shouting.stage:Shout", "vllm_backend"),
            "code_paths: no stage uses a class of its own",
        ),
        (
            lambda text: text.replace("shouting.stage:Shout", "shouting.stage:Nope"),
            "module 'shouting.stage' has no attribute 'Nope'",
        ),
        (
            lambda text: text.replace("code_paths: [../own_code]", "code_paths: ../own_code"),
            "code_paths: expected a list, got str '../own_code'",
        ),
        (
            lambda text: text.replace("code_paths: [../own_code]", "code_paths: []"),
            "cannot import module 'shouting.stage'",  # and the hint to list the folder
        ),
    ],
)
def test_code_paths_errors_name_the_key(tmp_path: Path, capsys, change, message: str):
    config = own_deployment(tmp_path, "./m")
    config.write_text(change(config.read_text()))
    assert main([str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err
    if "cannot import" in message:
        assert "list the folder under code_paths" in err
    assert not (tmp_path / "out").exists()


def test_a_module_that_shadows_another_is_refused(tmp_path: Path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "json.py").write_text("class X:\n    def process(self): ...\n")
    config = tmp_path / "deployment.yaml"
    config.write_text("model: ./m\ncode_paths: [own]\npostprocess: {class: 'json:X'}\n")
    with pytest.raises(ConfigError, match=r"module 'json' in code_paths is also at .*json.*: rename your module"):
        render(load_deployment(config), tmp_path / "repo")


def test_a_class_found_only_through_pythonpath_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """It would import here and fail in the stubs (they do not read PYTHONPATH): the renderer says so."""
    write_own_code(tmp_path / "own_code")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "own_code"))
    monkeypatch.syspath_prepend(str(tmp_path / "own_code"))
    for name in [n for n in sys.modules if n.split(".")[0] == "shouting"]:
        monkeypatch.delitem(sys.modules, name)
    config = tmp_path / "deployment.yaml"
    config.write_text("model: ./m\npostprocess: {class: 'shouting.stage:Shout'}\n")
    with pytest.raises(ConfigError, match="only through PYTHONPATH or the current directory .* list its folder under"):
        render(load_deployment(config), tmp_path / "repo")
    config.write_text(config.read_text() + "code_paths: [own_code]\n")
    assert "code_paths" in json.loads(render(load_deployment(config), tmp_path / "repo")["postprocess/1/stage.json"])


def test_the_adapter_loader_puts_the_code_paths_first_on_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    folder = write_own_code(tmp_path / "loader_code")
    (folder / "shouting").rename(folder / "shouting_loader")
    (folder / "shouting_loader" / "stage.py").write_text(
        (folder / "shouting_loader" / "stage.py").read_text().replace("shouting.style", "shouting_loader.style")
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError, match="its code folder .* does not exist"):
        load_stage_class("shouting_loader.stage:Shout", [str(tmp_path / "missing")])
    cls = load_stage_class("shouting_loader.stage:Shout", [str(folder)])
    assert sys.path[0] == str(folder)
    assert Path(sys.modules[cls.__module__].__file__).is_relative_to(folder)


# Served ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def own_code_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """The own stage behind an ensemble (own_model) and behind the BLS entry (own_bls), from a tmp folder."""
    workdir = tmp_path_factory.mktemp("own_code")
    ensemble = own_deployment(workdir / "ensemble", tiny_model, names="{plain: own_model, streaming: own_model_stream}")
    bls = own_deployment(workdir / "bls", tiny_model, entry="bls", names="{plain: own_bls, streaming: own_bls_stream}")
    repository = workdir / "repository"
    render_together([with_own_internal_names(load_deployment(c)) for c in (ensemble, bls)], repository)
    server = start_server(repository, workdir / "tritonserver.log")
    yield server
    server.stop()


@pytest.mark.server
@pytest.mark.parametrize("model", ["own_model", "own_bls"])
def test_own_stage_from_a_folder_outside_the_project_answers(own_code_server, model: str):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(own_code_server.grpc_url)
    try:
        outputs = grpc_infer(client, PROMPT, GREEDY, model=model)
    finally:
        client.close()
    text = outputs["text_output"][0].decode()
    # The vLLM-backend output echoes the prompt: upper-cased and prefixed by the own stage.
    assert text.startswith("[own] " + PROMPT.upper()) and len(text) > len("[own] " + PROMPT)
    assert text[len("[own] ") :] == text[len("[own] ") :].upper()


@pytest.mark.server
@pytest.mark.parametrize("model", ["own_model_stream", "own_bls_stream"])
def test_own_stage_shapes_every_streamed_delta(own_code_server, model: str):
    events = sse_events(own_code_server.http_url, {"text_input": PROMPT, "parameters": GREEDY}, model=model)
    texts = [event["text_output"] for event in events]
    assert texts and all(t.startswith("[own] ") for t in texts)
    deltas = [t[len("[own] ") :] for t in texts]
    assert all(d == d.upper() for d in deltas) and "".join(deltas).strip()
