"""tools/render_repo.py: the checked-in repository is its rendering; configs are validated before writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.render_repo import DEFAULT_CONFIG, DEFAULT_OUT, ConfigError, drift, load_deployment, main, render


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
    assert len(read(first)) == 15


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
        ("engine_args: {}\n", "missing required key(s) ['model']"),
        ("model: ${MODEL_PATH}\n", "model: unresolved placeholder in '${MODEL_PATH}'"),
        (
            "model: ./m\npostprocess: {class: nowhere.module:Cls}\n",
            "postprocess.class: stage class 'nowhere.module:Cls'",
        ),
        ("- just a list\n", "config: expected a mapping, got list"),
        ("model: ./m\npostprocess: {instances: 2}\n", "postprocess.instances: must be 1"),
        ("model: ./m\npreprocess: {instances: 0}\n", "preprocess.instances: must be >= 1"),
        ("model: ./m\nnames: {plain: x, streaming: x}\n", "names: model names must differ, ['x'] used twice"),
    ],
)
def test_config_errors_name_the_key_and_write_nothing(tmp_path: Path, capsys, text: str, message: str):
    out = tmp_path / "out"
    assert main([str(_config(tmp_path, text)), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_config_error_is_a_value_error_for_library_callers(tmp_path: Path):
    with pytest.raises(ConfigError):
        load_deployment(_config(tmp_path, "model: 3\n"))
