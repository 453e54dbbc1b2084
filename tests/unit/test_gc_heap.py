"""core/gc_heap.py: the startup heap frozen (or not, with the switch), and the collector's runs counted."""

from __future__ import annotations

import gc

import pytest

from core.gc_heap import FREEZE_ENVIRONMENT_KEY, GcPauses, freeze_startup_heap, unfreeze_heap


@pytest.fixture
def unfrozen():
    unfreeze_heap()
    yield
    unfreeze_heap()  # the test process keeps its heap collectable


def test_freezing_hides_the_startup_heap_from_full_collections(unfrozen, monkeypatch):
    monkeypatch.delenv(FREEZE_ENVIRONMENT_KEY, raising=False)
    startup = [[i] for i in range(50_000)]  # tracked objects made "at startup"
    frozen = freeze_startup_heap()
    # other threads of the test process (earlier tests' daemons) may free a few frozen objects meanwhile (seen in CI)
    assert frozen >= len(startup) and len(startup) <= gc.get_freeze_count() <= frozen
    tracked = len(gc.get_objects(generation=2))
    assert tracked < frozen  # a full collection no longer walks them
    unfreeze_heap()
    assert gc.get_freeze_count() == 0 and len(gc.get_objects()) >= len(startup)


def test_the_switch_leaves_the_heap_unfrozen_unless_told_otherwise(unfrozen, monkeypatch):
    monkeypatch.setenv(FREEZE_ENVIRONMENT_KEY, "0")
    assert freeze_startup_heap() == 0 and gc.get_freeze_count() == 0
    assert freeze_startup_heap(switchable=False) > 0  # the benchmark's bare engine is frozen whatever it says


def test_pauses_count_full_and_young_collections_per_interval():
    pauses = GcPauses()
    try:
        gc.collect(2)
        gc.collect(0)
        snap = pauses.snapshot()
        assert snap.full_collections == 1 and snap.young_collections >= 1
        assert snap.full_max_ms <= snap.full_ms and "1 full collections" in snap.describe()
        assert pauses.snapshot().full_collections == 0  # reset by the snapshot
    finally:
        pauses.stop()
    gc.collect(2)
    assert pauses.snapshot().full_collections == 0  # stopped: no longer counting
