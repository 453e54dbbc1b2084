"""Fixtures of the unit tests."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from repo_render import load_deployment, render, write
from tests.support.fake_triton import adapters_with_fake_stub


@pytest.fixture
def triton_models(monkeypatch: pytest.MonkeyPatch):
    """core.triton_models with a stand-in for the Triton stub's own module (tests/support/fake_triton.py)."""
    yield from adapters_with_fake_stub(monkeypatch)


@pytest.fixture
def rendered_core(tmp_path: Path, tiny_model: Path, triton_models, monkeypatch: pytest.MonkeyPatch):
    """Start the core model (fake stub and engine) of a tiny-model deployment with the given `core:` settings, from
    its rendered repository: returns the model and the rendered files; every core started is finalized after the
    test."""
    monkeypatch.setattr(sys, "setswitchinterval", lambda seconds: None)
    started: list[Any] = []

    def start(core_settings: str) -> tuple[Any, dict[str, str]]:
        config = tmp_path / "deployment.yaml"
        config.write_text(f"model: {tiny_model}\ncore: {core_settings}\n")
        out = tmp_path / "repo"
        files = render(load_deployment(config), out)
        write(files, out)
        model = triton_models.CoreModel()
        model.initialize({"model_repository": str(out / "vllm_core"), "model_version": "1", "model_name": "vllm_core"})
        started.append(model)
        return model, files

    starter: Callable[[str], tuple[Any, dict[str, str]]] = start
    yield starter
    for model in started:
        model.finalize()
