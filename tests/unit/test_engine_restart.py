"""The core's restart policy (core/engine.py Engine._supervise) without Triton or vLLM: the vLLM engine is
replaced by a stand-in whose `errored` flag the test sets, and whose start can be made to fail. That lets the
bounds and the backoff be checked quickly; tests/integration/test_engine_failure.py kills a real EngineCore under a real
tritonserver for the end-to-end behaviour."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from core import engine as engine_module
from core.engine import RESTARTING, Engine, RestartPolicy
from core.interface import Unavailable
from core.protocol import EngineRequest

WAIT_SECONDS = 10  # generous: the supervisor polls every 0.25 s


class StandIn:
    """What the supervisor and submit() read of vLLM's AsyncLLM: `errored`, `shutdown()`, `tokenizer`."""

    tokenizer = None

    def __init__(self) -> None:
        self.errored = False
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


class StandInEngine(Engine):
    def __init__(self, policy: RestartPolicy, starts: list[str] | None = None) -> None:
        super().__init__({}, offload_detokenization=False, restart=policy)
        self.starts = list(starts or [])  # per start after the first: "ok" or "fail" ("ok" when used up)
        self.engines: list[StandIn] = []
        self.started_at: list[float] = []
        self._probe_ids = itertools.count()

    def _new_llm(self) -> StandIn:
        self.started_at.append(time.monotonic())
        if len(self.started_at) > 1 and self.starts and self.starts.pop(0) == "fail":
            raise RuntimeError("the new EngineCore failed to start")
        self.engines.append(StandIn())
        return self.engines[-1]

    def refusal(self) -> str | None:
        """The error a new request gets now (None if it was accepted). An accepted one is aborted by its key
        before it reaches the stand-in (an abort that overtakes its request cancels the task before it runs)."""
        key = f"probe-{next(self._probe_ids)}"
        self.cancel_key(key)
        errors: list[Exception] = []
        accepted = self.submit(
            EngineRequest(sampling={}), lambda _r, error, _f: errors.append(error), lambda: False, key=key
        )
        if accepted is not None:
            return None
        assert isinstance(errors[0], Unavailable)
        return str(errors[0])


def _wait(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "the supervisor did not get there"
        time.sleep(0.02)


@pytest.fixture
def make_engine():
    made: list[StandInEngine] = []

    def make(policy: RestartPolicy, starts: list[str] | None = None) -> StandInEngine:
        engine = StandInEngine(policy, starts)
        engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown()


def test_a_dead_engine_is_replaced_and_new_requests_hear_it_is_restarting(make_engine):
    engine = make_engine(RestartPolicy(max_restarts=3, restart_backoff_seconds=0.5))
    first = engine.engines[0]
    first.errored = True
    assert engine.refusal() == RESTARTING  # at once, before the supervisor has even seen the death
    _wait(lambda: engine.restarts == 1)
    assert first.shut_down and len(engine.engines) == 2
    assert engine.started_at[1] - engine.started_at[0] >= 0.5  # the backoff
    assert engine.refusal() is None  # the engine runs again: the request was accepted


def test_failing_starts_back_off_exponentially_and_give_up_after_max_restarts(make_engine):
    engine = make_engine(RestartPolicy(max_restarts=3, restart_backoff_seconds=0.1), starts=["fail"] * 10)
    engine.engines[0].errored = True
    _wait(lambda: "stays down" in (engine.refusal() or ""))
    assert engine.refusal() == (
        "the vLLM engine died and 3 restart(s) in a row failed; it stays down until the server is restarted"
    )
    time.sleep(1.0)  # longer than the next backoff would be: no fourth attempt
    assert len(engine.started_at) == 1 + 3 and engine.restarts == 0
    gaps = [b - a for a, b in zip(engine.started_at[1:], engine.started_at[2:], strict=False)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps  # 0.1, then 0.2, then 0.4 s before the attempts


def test_restarts_that_do_not_hold_count_as_failures(make_engine):
    engine = make_engine(RestartPolicy(max_restarts=2, restart_backoff_seconds=0.05))
    for restarts in (1, 2):
        engine.engines[-1].errored = True
        _wait(lambda restarts=restarts: engine.restarts == restarts)
    engine.engines[-1].errored = True  # a third death within STABLE_SECONDS of the last restart
    _wait(lambda: "stays down" in (engine.refusal() or ""))
    assert "2 restart(s) in a row failed" in engine.refusal()
    assert len(engine.engines) == 3


def test_an_engine_that_held_resets_the_count(make_engine, monkeypatch):
    monkeypatch.setattr(engine_module, "STABLE_SECONDS", 0.0)  # every restart counts as having held
    engine = make_engine(RestartPolicy(max_restarts=1, restart_backoff_seconds=0.05))
    for restarts in (1, 2, 3):
        engine.engines[-1].errored = True
        _wait(lambda restarts=restarts: engine.restarts == restarts)
    assert engine.refusal() is None


def test_without_restart_a_dead_engine_stays_dead(make_engine):
    engine = make_engine(RestartPolicy(restart_engine=False))
    engine.engines[0].errored = True
    time.sleep(1.0)
    assert engine.refusal() == "the vLLM engine is not running"
    assert len(engine.started_at) == 1
