"""The supported vLLM range: what is accepted, what is refused with which message, and that the engine checks it
before it builds anything."""

from __future__ import annotations

import pytest

from core.engine import Engine
from core.vllm_version import (
    OVERRIDE_VARIABLE,
    UnsupportedVllmVersion,
    check_vllm_version,
    is_supported,
)


@pytest.mark.parametrize("version", ["0.26.0", "0.26.1", "0.32.0", "0.32.0+cpu", "0.29.3.dev12+g1234"])
def test_tested_and_in_between_releases_are_supported(version: str) -> None:
    assert is_supported(version)
    assert check_vllm_version(version) is None


@pytest.mark.parametrize("version", ["0.25.2", "0.33.0", "0.33.0rc1", "1.0.0"])
def test_releases_outside_the_range_are_refused_with_what_to_do(version: str, monkeypatch) -> None:
    monkeypatch.delenv(OVERRIDE_VARIABLE, raising=False)
    with pytest.raises(UnsupportedVllmVersion) as caught:
        check_vllm_version(version)
    text = str(caught.value)
    assert f"vLLM {version} is not supported" in text
    assert ">=0.26.0,<0.33.0" in text and "tools/setup_env.sh" in text and OVERRIDE_VARIABLE in text


def test_the_override_turns_the_refusal_into_a_warning(monkeypatch) -> None:
    monkeypatch.setenv(OVERRIDE_VARIABLE, "1")
    warning = check_vllm_version("0.40.0")
    assert warning is not None and "trying it" in warning


def test_the_installed_vllm_is_supported() -> None:
    import vllm

    assert is_supported(vllm.__version__), vllm.__version__


def test_the_engine_refuses_an_unsupported_vllm_before_building_one(monkeypatch) -> None:
    import vllm

    monkeypatch.delenv(OVERRIDE_VARIABLE, raising=False)
    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    # A model that does not exist: had the check not come first, vLLM would fail on it instead.
    engine = Engine({"model": "/nonexistent/model"})
    with pytest.raises(UnsupportedVllmVersion, match="vLLM 0.99.0 is not supported"):
        engine.start()
