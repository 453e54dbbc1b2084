"""An Engine (core/engine.py) without vLLM: a stand-in engine client, and a loop that records each request it takes
in instead of starting it. What the engine does around vLLM (intake, the cancel watcher), tested without it."""

from __future__ import annotations

from core.engine import Engine
from core.protocol import EngineRequest


class RecordingEngine(Engine):
    """An Engine whose vLLM is a stand-in and whose loop records each request it takes in."""

    def __init__(self) -> None:
        super().__init__({}, offload_detokenization=False)
        self.taken: list[str] = []

    def _new_llm(self) -> object:
        class StandIn:
            tokenizer = None
            errored = False

            def shutdown(self) -> None:
                pass

        return StandIn()

    def _start_task(self, request_id: str, request: EngineRequest, submitted: float) -> None:
        self.taken.append(request_id)
