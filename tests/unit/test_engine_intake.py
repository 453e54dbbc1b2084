"""The engine's intake (core/engine.py): requests submitted from Triton's threads reach the engine loop in their
order, with one wake-up of the loop for all that arrive while it is busy (each wake-up is a GIL-releasing write
that costs a busy stub up to a switch interval). No Triton, no vLLM (tests/support/recording_engine.py)."""

from __future__ import annotations

import threading
import time

from core.protocol import EngineRequest
from tests.support.recording_engine import RecordingEngine


def test_requests_that_arrive_while_the_loop_is_busy_are_taken_in_order_with_one_wake_up():
    engine = RecordingEngine()
    engine.start()
    try:
        loop = engine._loop
        busy, wake_ups = threading.Event(), []
        loop.call_soon_threadsafe(busy.wait, 10)  # the loop is busy until the test releases it
        original = loop.call_soon_threadsafe

        def counting(callback, *args):
            wake_ups.append(callback)
            return original(callback, *args)

        loop.call_soon_threadsafe = counting
        ids = [engine.submit(EngineRequest(sampling={}), lambda *_: None, lambda: False) for _ in range(5)]
        busy.set()
        deadline = time.monotonic() + 10
        while len(engine.taken) < len(ids):
            assert time.monotonic() < deadline, f"taken in: {engine.taken}"
            time.sleep(0.01)
        assert engine.taken == ids
        assert len(wake_ups) == 1
        # The loop took them in: the next request wakes it again.
        later = engine.submit(EngineRequest(sampling={}), lambda *_: None, lambda: False)
        while later not in engine.taken:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert len(wake_ups) == 2
    finally:
        del engine._loop.call_soon_threadsafe
        engine.shutdown()
