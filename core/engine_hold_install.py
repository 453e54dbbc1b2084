"""core/engine_hold.py's OutputHolder inside vLLM's EngineCore (deployment key `core.hold_outputs_in_engine`).

The EngineCore's `step` and `step_with_batch_queue` return each step's outputs by client; wrapped, they return
them through one OutputHolder per EngineCore. An EngineCore in this process (vLLM's multiprocessing off) or forked
from it gets the wrapped class; a spawned one (the GPU default, core/engine_start_method.py) is a fresh
interpreter, so vLLM's launcher is given a process target of this module's that wraps the class there first, then
runs vLLM's own `run_engine_core`.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from core.engine_hold import OutputHolder, known_fields

# Under vLLM's logger, whose handler every vLLM process has (the EngineCore's output reaches tritonserver's log)
log = logging.getLogger("vllm.engine_hold")
_MARK = "_holds_outputs"  # on what this module installed: installing twice changes nothing
_original_run_engine_core: Callable[..., Any] | None = None  # vLLM's, in the process that installed the target


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
    from vllm.v1.engine.core import EngineCore

    for name in ("step", "step_with_batch_queue"):
        step = getattr(EngineCore, name)
        if not getattr(step, _MARK, False):
            setattr(EngineCore, name, _holding(step))


def _holding(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def holding_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs, model_executed = step(self, *args, **kwargs)
        holder = self.__dict__.get("_output_holder")
        if holder is None:
            holder = self._output_holder = OutputHolder(
                self.scheduler.requests.get, self.vllm_config.scheduler_config.stream_interval
            )
        outputs = holder.filter(outputs)
        if holder.held and not self.__dict__.get("_output_holder_said"):
            self._output_holder_said = True
            log.info("core.hold_outputs_in_engine: this EngineCore (process %d) holds outputs", os.getpid())
        return outputs, model_executed

    setattr(holding_step, _MARK, True)
    return holding_step
