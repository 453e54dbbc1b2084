"""The default preprocess stage: prompt -> token ids, strict sampling parameters, output options.

Accepts the Triton vLLM backend's inputs, so its clients work unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.interface import InvalidInput
from core.protocol import EngineRequest
from core.stage import Stage, bool_scalar, string_scalar
from preprocess.sampling import validate_sampling


class Preprocessor(Stage):
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
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
        self.max_model_len: int | None = settings.get("max_model_len")
        self.max_logprobs: int | None = settings.get("max_logprobs")
        loras = settings.get("lora_names")
        self.known_loras = frozenset(loras) if loras is not None else None

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        prompt = string_scalar(inputs, tensors.TEXT_INPUT.name)
        if prompt is None:
            raise InvalidInput(f"{tensors.TEXT_INPUT.name} is required")
        request = self.build_request(prompt, inputs, parameters)
        return {tensors.ENGINE_REQUEST.name: np.array([request.to_json().encode("utf-8")], dtype=np.object_)}

    def build_request(
        self, prompt: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> EngineRequest:
        stream = bool_scalar(inputs, tensors.STREAM.name, False)
        # The vLLM backend's rule: the prompt is echoed unless excluded, and by default not when streaming.
        exclude_input = bool_scalar(inputs, tensors.EXCLUDE_INPUT_IN_OUTPUT.name, stream)
        if stream and not exclude_input:
            raise InvalidInput("exclude_input_in_output=false is not allowed when streaming")
        sampling = validate_sampling(
            string_scalar(inputs, tensors.SAMPLING_PARAMETERS.name),
            parameters,
            max_logprobs=self.max_logprobs,
            known_loras=self.known_loras,
        )
        token_ids = self.tokenizer.encode(prompt)
        self.check_length(len(token_ids), sampling.get("max_tokens"))
        return EngineRequest(
            sampling=sampling,
            prompt_token_ids=token_ids,
            stream=stream,
            lora_name=sampling.get("lora_name"),
            postprocess_options={
                "prompt_prefix": "" if exclude_input else prompt,
                "return": [flag.name for flag in tensors.RETURN_FLAGS if bool_scalar(inputs, flag.name, False)],
            },
        )

    def check_length(self, prompt_tokens: int, max_tokens: int | None) -> None:
        if self.max_model_len is None:
            return
        if prompt_tokens >= self.max_model_len:
            raise InvalidInput(
                f"prompt is {prompt_tokens} tokens long; the model's context is {self.max_model_len} tokens"
                " and at least one must be left to generate"
            )
        if max_tokens is not None and prompt_tokens + max_tokens > self.max_model_len:
            raise InvalidInput(
                f"max_tokens={max_tokens}: the prompt's {prompt_tokens} tokens plus max_tokens exceed the model's"
                f" context of {self.max_model_len} tokens (at most {self.max_model_len - prompt_tokens})"
            )
