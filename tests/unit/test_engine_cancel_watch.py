"""The engine's cancel watcher (core/engine.py): the live requests' `is_cancelled` probes are polled side by side on a
pool of probe threads (on Triton each is an IPC round trip that waits behind a busy stub's responses), and a request
submitted without a probe costs the watcher nothing. No Triton, no vLLM (tests/support/recording_engine.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from core.protocol import EngineRequest
from tests.support.recording_engine import RecordingEngine


@pytest.fixture
def engine(monkeypatch):
    monkeypatch.setattr("core.engine.CANCEL_POLL_SECONDS", 0.05)
    engine = RecordingEngine()
    engine.start()
    yield engine
    engine.shutdown()


def _cancel_requested(engine: RecordingEngine, request_id: str) -> bool:
    with engine._live_lock:
        return engine._live[request_id].cancel_requested


def _wait_for(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_probes_run_side_by_side_and_a_true_one_aborts_its_request(engine):
    # Each probe answers only once all four are in flight together: one after the other, the first would wait out
    # the barrier's timeout and break it.
    barrier = threading.Barrier(4, timeout=5)
    passed: set[int] = set()

    def probe(index: int):
        def is_cancelled() -> bool:
            if index not in passed:
                barrier.wait()
                passed.add(index)
            return True

        return is_cancelled

    ids = [engine.submit(EngineRequest(sampling={}), lambda *_: None, probe(i)) for i in range(4)]
    _wait_for(lambda: all(_cancel_requested(engine, request_id) for request_id in ids))
    assert passed == {0, 1, 2, 3}
    assert not barrier.broken


def _probe_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name.startswith("vllm-cancel-probe")}


def test_a_request_without_a_probe_is_not_watched_and_a_failing_probe_means_gone(engine):
    before = _probe_threads()  # an earlier test's engine may still be closing its pool
    quiet = engine.submit(EngineRequest(sampling={}), lambda *_: None, None)
    time.sleep(0.3)  # several of the watcher's polls
    assert _probe_threads() <= before  # this engine started none

    def gone() -> bool:
        raise RuntimeError("the request's sender is gone")

    failing = engine.submit(EngineRequest(sampling={}), lambda *_: None, gone)
    _wait_for(lambda: _cancel_requested(engine, failing))
    assert not _cancel_requested(engine, quiet)
