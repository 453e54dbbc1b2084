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
from core.stage import Stage, bool_scalar, string_scalar
from core.vllm_defaults import FALLBACK_MAX_TOKENS
from preprocess.sampling import validate_sampling


class RawPreprocessor(Stage):
    inputs = (
        tensors.TEXT_INPUT,
        tensors.STREAM,
        tensors.SAMPLING_PARAMETERS,
        tensors.EXCLUDE_INPUT_IN_OUTPUT,
        *tensors.RETURN_FLAGS,
    )
    outputs = (tensors.ENGINE_REQUEST,)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.max_logprobs: int | None = settings.get("max_logprobs")
        self.default_max_tokens: int = settings.get("default_max_tokens", FALLBACK_MAX_TOKENS)
        loras = settings.get("lora_names")
        self.known_loras = frozenset(loras) if loras is not None else None

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        prompt = string_scalar(inputs, tensors.TEXT_INPUT.name)
        if prompt is None:
            raise InvalidInput(f"{tensors.TEXT_INPUT.name} is required")
        stream = bool_scalar(inputs, tensors.STREAM.name, False)
        # The vLLM backend's rule: the prompt is echoed unless excluded, and by default not when streaming.
        exclude_input = bool_scalar(inputs, tensors.EXCLUDE_INPUT_IN_OUTPUT.name, stream)
        if stream and not exclude_input:
            raise tensors.stream_echo_error()
        sampling = validate_sampling(
            string_scalar(inputs, tensors.SAMPLING_PARAMETERS.name),
            parameters,
            max_logprobs=self.max_logprobs,
            known_loras=self.known_loras,
            default_max_tokens=self.default_max_tokens,
        )
        request = EngineRequest(
            sampling=sampling,
            prompt=prompt,
            stream=stream,
            lora_name=sampling.get("lora_name"),
            postprocess_options={
                "prompt_prefix": "" if exclude_input else prompt,
                "return": [flag.name for flag in tensors.RETURN_FLAGS if bool_scalar(inputs, flag.name, False)],
            },
        )
        return {tensors.ENGINE_REQUEST.name: np.array([request.to_json().encode("utf-8")], dtype=np.object_)}
