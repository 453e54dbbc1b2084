"""The Triton adapter of a preprocess or postprocess stage (its class and settings from stage.json)."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

from core.adapters.common import LoadedStage, request_parameters, triton_error, version_dir
from core.gc_heap import freeze_startup_heap
from core.interface import InvalidInput
from core.settings import STAGE_FILE


class StageModel:
    """A preprocess or postprocess stage: `stage.json` names the class and its settings."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        spec = json.loads((version_dir(args) / STAGE_FILE).read_text())
        self.loaded = LoadedStage(spec, Path(args["model_repository"]).parent)
        self.stage = self.loaded.stage
        freeze_startup_heap()  # the stage's tokenizer and modules (core/gc_heap.py)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._run(request) for request in requests]

    def _run(self, request: Any) -> Any:
        try:
            outputs = self.loaded.run(self.loaded.inputs_of(request), request_parameters(request))
            return pb_utils.InferenceResponse(output_tensors=outputs)
        except InvalidInput as exc:
            return pb_utils.InferenceResponse(error=triton_error(exc))
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the model down
            self.logger.log_error(f"stage {type(self.stage).__name__} failed: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(error=triton_error(exc))
