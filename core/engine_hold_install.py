"""core/engine_hold.py's OutputHolder inside vLLM's EngineCore (deployment key `core.hold_outputs_in_engine`).

Where the holding runs: in an EngineCore process (vLLM's EngineCoreProc, the GPU default) on its output thread,
which takes each client's message off the output queue to encode and send it; a held output then costs that thread
less than sending it did, and the busy loop nothing. The queue's class is swapped for one whose `get` filters. An
EngineCore in the core's own process (vLLM's multiprocessing off) has no output thread: its `step` is wrapped
instead. A spawned EngineCore (core/engine_start_method.py) is a fresh interpreter, so vLLM's launcher is given a
process target of this module's that installs the holding there first, then runs vLLM's own `run_engine_core`.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
from collections.abc import Callable
from typing import Any

from core.engine_hold import OutputHolder, known_fields

# Under vLLM's logger, whose handler every vLLM process has (the EngineCore's output reaches tritonserver's log)
log = logging.getLogger("vllm.engine_hold")
_MARK = "_holds_outputs"  # on what this module installed: installing twice changes nothing
_original_run_engine_core: Callable[..., Any] | None = None  # vLLM's, in the process that installed the target
_announced = False  # _announce_once's


def install() -> bool:
    """Hold outputs in every EngineCore this process runs or starts from now on. False (nothing installed) when this
    vLLM's outputs have fields core/engine_hold.py does not know."""
    global _original_run_engine_core
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.engine.core import EngineCoreProc

    if not known_fields(EngineCoreOutput, EngineCoreOutputs):
        return False
    hold_in_this_process()
    if not getattr(EngineCoreProc.run_engine_core, _MARK, False):
        _original_run_engine_core = EngineCoreProc.run_engine_core
        EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
    return True


def run_engine_core(*args: Any, **kwargs: Any) -> Any:
    """The EngineCore process's target: vLLM's, with the holding installed in this process first."""
    hold_in_this_process()
    from vllm.v1.engine.core import EngineCoreProc

    # Spawned: this is a fresh interpreter, where the class still has vLLM's own. Forked: the installer's module state.
    run = _original_run_engine_core or EngineCoreProc.run_engine_core
    return run(*args, **kwargs)


setattr(run_engine_core, _MARK, True)


def hold_in_this_process() -> None:
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    for name in ("step", "step_with_batch_queue"):
        step = getattr(EngineCore, name)
        if not getattr(step, _MARK, False):
            setattr(EngineCore, name, _holding_step(step))
    if not getattr(EngineCoreProc.__init__, _MARK, False):
        EngineCoreProc.__init__ = _holding_queue(EngineCoreProc.__init__)


def _holder(engine_core: Any) -> OutputHolder:
    return OutputHolder(engine_core.scheduler.requests.get, engine_core.vllm_config.scheduler_config.stream_interval)


def _holding_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """An in-process EngineCore's step, its outputs through a holder (an EngineCoreProc's go through its queue)."""

    @functools.wraps(step)
    def holding_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs, model_executed = step(self, *args, **kwargs)
        if "output_queue" in self.__dict__:
            return outputs, model_executed
        holder = self.__dict__.get("_output_holder")
        if holder is None:
            holder = self._output_holder = _holder(self)
        outputs = holder.filter(outputs)
        _announce_once(holder)
        return outputs, model_executed

    setattr(holding_step, _MARK, True)
    return holding_step


def _holding_queue(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def holding_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        # The output thread may already wait in the old class's get: it takes one message unfiltered, then the next
        # through _HoldingQueue.get (a queue.Queue subclass with no state of its own, so the swap is safe).
        self.output_queue.holder = _holder(self)
        self.output_queue.__class__ = _HoldingQueue

    setattr(holding_init, _MARK, True)
    return holding_init


class _HoldingQueue(queue.Queue):
    """vLLM's output queue, whose consumer (the output thread) gets each client's message with what is held taken
    out, and no message when nothing is left."""

    holder: OutputHolder

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        while True:
            item = super().get(block, timeout)
            if not isinstance(item, tuple) or self.holder.keeps(item[1]):
                _announce_once(self.holder)
                return item


def _announce_once(holder: OutputHolder) -> None:
    """The log line that says this process's EngineCore holds outputs, once it has held one (one EngineCore a
    process)."""
    global _announced
    if holder.held and not _announced:
        _announced = True
        log.info("core.hold_outputs_in_engine: this EngineCore (process %d) holds outputs", os.getpid())
