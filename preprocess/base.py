"""The base of the built-in preprocess stages: the Triton vLLM backend's request options and their rules.

Every built-in preprocess takes the backend's inputs besides the prompt (`stream`, `sampling_parameters`,
`exclude_input_in_output`, the `return_*` flags) with the same rules, and answers one `engine_request`; a
stage adds how it reads the prompt (see preprocess/default.py and preprocess/raw.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.protocol import EngineRequest, encode_request
from core.stage import Stage, bool_scalar, string_scalar
from core.vllm_defaults import FALLBACK_MAX_TOKENS
from preprocess.sampling import validate_sampling

# The inputs after the prompt's own, in this order in every built-in stage's config.
REQUEST_OPTION_INPUTS = (
    tensors.STREAM,
    tensors.SAMPLING_PARAMETERS,
    tensors.EXCLUDE_INPUT_IN_OUTPUT,
    *tensors.RETURN_FLAGS,
)


class EnginePreprocessor(Stage):
    """Settings read here: `max_logprobs` (the engine's), `default_max_tokens` (vLLM's SamplingParams default,
    written by the renderer: core/vllm_defaults.py) and `lora_names` (the adapters the core serves)."""

    outputs = (tensors.ENGINE_REQUEST,)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.max_logprobs: int | None = settings.get("max_logprobs")
        self.default_max_tokens: int = settings.get("default_max_tokens", FALLBACK_MAX_TOKENS)
        loras = settings.get("lora_names")
        self.known_loras = frozenset(loras) if loras is not None else None

    def build_request(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> EngineRequest:
        raise NotImplementedError

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        request = self.build_request(inputs, parameters)
        return {tensors.ENGINE_REQUEST.name: tensors.document_tensor(tensors.ENGINE_REQUEST, encode_request(request))}

    @staticmethod
    def stream_and_exclude_input(inputs: Mapping[str, np.ndarray]) -> tuple[bool, bool]:
        """(stream, exclude_input_in_output), by the vLLM backend's rule: the prompt is echoed unless excluded,
        and by default not when streaming; asking for the echo in a stream is an error."""
        stream = bool_scalar(inputs, tensors.STREAM.name, False)
        exclude_input = bool_scalar(inputs, tensors.EXCLUDE_INPUT_IN_OUTPUT.name, stream)
        if stream and not exclude_input:
            raise tensors.stream_echo_error()
        return stream, exclude_input

    def sampling(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, Any]:
        """The checked sampling parameters: the JSON tensor over the request parameters."""
        return validate_sampling(
            string_scalar(inputs, tensors.SAMPLING_PARAMETERS.name),
            parameters,
            max_logprobs=self.max_logprobs,
            known_loras=self.known_loras,
            default_max_tokens=self.default_max_tokens,
        )

    @staticmethod
    def engine_request(
        inputs: Mapping[str, np.ndarray],
        sampling: dict[str, Any],
        *,
        stream: bool,
        echo: str,
        **prompt: Any,
    ) -> EngineRequest:
        """The request for the core; `prompt`: EngineRequest's prompt fields (prompt_token_ids, prompt,
        images), `echo`: the prompt text postprocess puts before the output ("" when excluded)."""
        return EngineRequest(
            sampling=sampling,
            stream=stream,
            lora_name=sampling.get("lora_name"),
            postprocess_options={
                "prompt_prefix": echo,
                "return": [flag.name for flag in tensors.RETURN_FLAGS if bool_scalar(inputs, flag.name, False)],
            },
            **prompt,
        )
