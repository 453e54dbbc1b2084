"""repo_render `entry`: "bls" renders Python entry models (so a client's cancel reaches the engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

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


def test_unknown_entry_kind_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match="entry: must be one of ensemble, bls"):
        load_deployment(_config(tmp_path, entry="sidecar"))
