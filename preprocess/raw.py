"""A raw-prompt preprocess stage: `text_input` goes to the engine as it is, with no chat template and no
tokenizer in this process (vLLM tokenizes it). For base models and clients that format prompts themselves.

Same inputs and semantics as the vLLM backend otherwise (sampling parameters, echo rules, `return_*` flags);
the prompt-length check is vLLM's own (its error comes back as INVALID_ARG).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.interface import InvalidInput
from core.protocol import EngineRequest
from core.stage import string_scalar
from preprocess.base import REQUEST_OPTION_INPUTS, EnginePreprocessor


class RawPreprocessor(EnginePreprocessor):
    inputs = (tensors.TEXT_INPUT, *REQUEST_OPTION_INPUTS)

    def build_request(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> EngineRequest:
        prompt = string_scalar(inputs, tensors.TEXT_INPUT.name)
        if prompt is None:
            raise InvalidInput(f"{tensors.TEXT_INPUT.name} is required")
        stream, exclude_input = self.stream_and_exclude_input(inputs)
        sampling = self.sampling(inputs, parameters)
        return self.engine_request(inputs, sampling, stream=stream, echo="" if exclude_input else prompt, prompt=prompt)
