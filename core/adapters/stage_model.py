"""The Triton adapter of a preprocess or postprocess stage (its class and settings from stage.json)."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from core.adapters.common import (
    STAGE_FILE,
    STAGE_PATH_KEYS,
    load_stage_from_spec,
    request_parameters,
    triton_error,
    version_dir,
)
from core.engine_config import resolve_paths
from core.gc_heap import freeze_startup_heap
from core.interface import InvalidInput


class StageModel:
    """A preprocess or postprocess stage: `stage.json` names the class and its settings."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        spec = json.loads((version_dir(args) / STAGE_FILE).read_text())
        repository_root = Path(args["model_repository"]).parent
        stage_class = load_stage_from_spec(spec, repository_root)
        self.stage = stage_class(resolve_paths(spec.get("settings", {}), repository_root, STAGE_PATH_KEYS))
        self.input_names = [t.name for t in stage_class.inputs]
        self.output_types = {t.name: t.numpy_dtype for t in stage_class.outputs}
        freeze_startup_heap()  # the stage's tokenizer and modules (core/gc_heap.py)

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._run(request) for request in requests]

    def _run(self, request: Any) -> Any:
        try:
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            outputs = self.stage.process(inputs, request_parameters(request))
            return pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, np.asarray(value, dtype=self.output_types[name]))
                    for name, value in outputs.items()
                ]
            )
        except InvalidInput as exc:
            return pb_utils.InferenceResponse(error=triton_error(exc))
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the model down
            self.logger.log_error(f"stage {type(self.stage).__name__} failed: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(error=triton_error(exc))
