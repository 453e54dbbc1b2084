"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

from tests.support.fake_triton import adapters_with_fake_stub


@pytest.fixture
def triton_models(monkeypatch: pytest.MonkeyPatch):
    """core.triton_models with a stand-in for the Triton stub's own module (tests/support/fake_triton.py)."""
    yield from adapters_with_fake_stub(monkeypatch)
