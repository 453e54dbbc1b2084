"""core/settings.py: what the adapters read is what the renderer wrote, and each default lives in one place."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from core.engine import Engine, RestartPolicy
from core.settings import SETTINGS_FILE, CoreSettings, EntrySettings, GenerateSettings, HealthSettings, load_settings
from repo_render import DEFAULT_CONFIG, load_deployment, render, write
from tests.support.fake_triton import FakeEngine


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.yaml"
    path.write_text(text)
    return path


def test_defaults_live_in_the_settings_models(tmp_path: Path):
    # A deployment that leaves every core key out renders exactly the model's defaults...
    files = render(load_deployment(_config(tmp_path, "model: ./m\n")), tmp_path / "repo")
    assert json.loads(files[f"vllm_core/1/{SETTINGS_FILE}"]) == CoreSettings().model_dump(mode="json")
    # ...and the engine built without a policy restarts as a deployment does by default.
    assert Engine({"model": "x"})._restart == HealthSettings() == RestartPolicy()
    assert HealthSettings().restart_engine is True


def test_the_adapters_read_what_the_renderer_writes(tmp_path: Path):
    config = _config(
        tmp_path,
        "model: ./m\nentry: bls\nmetrics: true\nstream_interval_ms: 7\nengine_env: {OMP_NUM_THREADS: '2'}\n"
        "health: {restart_engine: false, max_restarts: 2, restart_backoff_seconds: 3}\n"
        "core: {sender_threads: 4, switch_interval_ms: 0.5}\ngenerate: {max_in_flight: 9}\n"
        "names: {core: engine}\n",
    )
    out = tmp_path / "repo"
    write(render(load_deployment(config), out), out)
    core = load_settings(CoreSettings, out / "engine" / "1")
    assert (core.metrics, core.stream_interval_ms, core.engine_env) == (True, 7, {"OMP_NUM_THREADS": "2"})
    assert core.health == HealthSettings(restart_engine=False, max_restarts=2, restart_backoff_seconds=3.0)
    assert (core.core.sender_threads, core.core.switch_interval_ms) == (4, 0.5)
    assert load_settings(GenerateSettings, out / "generate" / "1") == GenerateSettings(
        core_model="engine", max_in_flight=9
    )
    assert load_settings(EntrySettings, out / "vllm_model_stream" / "1").stream is True
    assert load_settings(EntrySettings, out / "vllm_model" / "1").stream is False


def test_a_stale_or_hand_edited_settings_file_fails_the_load_naming_it(tmp_path: Path):
    (tmp_path / SETTINGS_FILE).write_text('{"metrics": "true"}')
    with pytest.raises(ValueError, match=r"(?s)settings.json: cannot read CoreSettings .*metrics"):
        load_settings(CoreSettings, tmp_path)
    (tmp_path / SETTINGS_FILE).write_text('{"core_model": "c", "max_in_flight": 1, "restart": 1}')
    with pytest.raises(ValueError, match="restart"):
        load_settings(GenerateSettings, tmp_path)
    with pytest.raises(ValueError, match="cannot read"):
        load_settings(CoreSettings, tmp_path / "missing")


def test_the_core_adapter_starts_the_engine_with_the_rendered_settings(tmp_path: Path, triton_models, monkeypatch):
    monkeypatch.setattr(sys, "setswitchinterval", lambda seconds: None)
    out = tmp_path / "repo"
    write(render(load_deployment(DEFAULT_CONFIG), out), out)
    expected = load_settings(CoreSettings, out / "vllm_core" / "1")
    for key in expected.engine_env:
        monkeypatch.setenv(key, "before")  # restored after the test: the adapter sets engine_env in os.environ
    model = triton_models.CoreModel()
    args = {"model_repository": str(out / "vllm_core"), "model_version": "1", "model_name": "vllm_core"}
    model.initialize(args)
    try:
        assert FakeEngine.created[-1]["restart"] == expected.health
        assert model.stream_interval == expected.stream_interval_ms / 1000
        assert len(model._outboxes) == expected.core.sender_threads
        assert {key: os.environ[key] for key in expected.engine_env} == expected.engine_env
    finally:
        model.finalize()
    generate = triton_models.GenerateModel()
    generate.initialize({"model_repository": str(out / "generate"), "model_version": "1"})
    assert (generate.core_model, generate.pool._max_workers) == ("vllm_core", 512)
    generate.finalize()
