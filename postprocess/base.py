"""The base of every postprocess stage: read the core's `engine_response` and decode its text.

The core usually sends token ids only (detokenization happens here, out of the engine process); every stage,
built-in or a deployment's own, gets the same decoded response from `engine_response()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.interface import InvalidInput
from core.protocol import DecodeError, EngineResponse, decode_response
from core.stage import Stage, scalar
from postprocess.detokenize import detokenize, load_detokenizer


class EnginePostprocessor(Stage):
    inputs = (tensors.ENGINE_RESPONSE,)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.detokenizer = load_detokenizer(self.settings)

    def engine_response(self, inputs: Mapping[str, np.ndarray]) -> EngineResponse:
        raw = scalar(inputs, tensors.ENGINE_RESPONSE.name)
        if raw is None:
            raise InvalidInput(f"{tensors.ENGINE_RESPONSE.name} is missing")
        try:
            response = decode_response(raw)
        except DecodeError as exc:  # not the core's document (a client may call this model directly)
            raise InvalidInput(f"{tensors.ENGINE_RESPONSE.name}: malformed ({exc})") from None
        # A stage without a tokenizer holds a NoDetokenizer: it refuses ids to decode, and passes decoded text.
        return detokenize(response, self.detokenizer)
