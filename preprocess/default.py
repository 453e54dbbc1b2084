"""The default preprocess stage: prompt or chat messages -> token ids, images, strict sampling parameters,
output options.

Accepts the Triton vLLM backend's inputs, so its clients work unchanged, and `messages` (OpenAI-style chat,
rendered with the chat template as vLLM's `LLM.chat` does, see preprocess/chat.py).

Settings (from the deployment config): `tokenizer`, `max_model_len`, `max_logprobs`, `default_max_tokens`
(vLLM's defaults, core/vllm_defaults.py), `lora_names`;
`chat_template` (inline) or `chat_template_file` (path) to replace the tokenizer's template;
`allow_request_chat_template` (default false); `image_placeholder` (default "<image>", the text vLLM puts in
a string-content prompt per image); `max_image_bytes`, `max_image_pixels`, `max_images` (preprocess/images.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.interface import InvalidInput
from core.protocol import EngineRequest
from core.stage import parse_bool, string_scalar
from preprocess.base import REQUEST_OPTION_INPUTS, EnginePreprocessor
from preprocess.chat import CHAT_OPTION_KEYS, parse_chat_options, parse_messages, render_chat
from preprocess.images import ImageLimits, decode_images
from preprocess.tokenize import TextEncoder


class Preprocessor(EnginePreprocessor):
    inputs = (tensors.TEXT_INPUT, tensors.MESSAGES, tensors.IMAGE, tensors.CHAT_OPTIONS, *REQUEST_OPTION_INPUTS)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
        self.encoder = TextEncoder(self.tokenizer)
        self.max_model_len: int | None = settings.get("max_model_len")
        self.chat_template = self._deployment_template(settings)
        self.allow_request_template = parse_bool(
            settings.get("allow_request_chat_template", False), "allow_request_chat_template"
        )
        self.image_placeholder: str = settings.get("image_placeholder") or "<image>"
        self.image_limits = ImageLimits.from_settings(settings)

    @staticmethod
    def _deployment_template(settings: Mapping[str, Any]) -> str | None:
        inline, path = settings.get("chat_template"), settings.get("chat_template_file")
        if inline and path:
            raise ValueError("preprocess settings: set chat_template or chat_template_file, not both")
        if path:
            from pathlib import Path

            return Path(path).read_text(encoding="utf-8")
        return inline or None

    def _prompt(
        self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]
    ) -> tuple[str, list[int], list[Any]]:
        """(prompt text, token ids, image sources) from text_input + image, or from messages."""
        text = string_scalar(inputs, tensors.TEXT_INPUT.name)
        messages = string_scalar(inputs, tensors.MESSAGES.name)
        if (text is None) == (messages is None):
            raise InvalidInput(
                f"send exactly one of {tensors.TEXT_INPUT.name} and {tensors.MESSAGES.name}"
                f" ({'both' if text is not None else 'neither'} given)"
            )
        image_array = inputs.get(tensors.IMAGE.name)
        tensor_images = [] if image_array is None else list(image_array.reshape(-1))
        options_json = string_scalar(inputs, tensors.CHAT_OPTIONS.name)
        if text is not None:
            chat_keys = sorted(CHAT_OPTION_KEYS & parameters.keys())
            if options_json is not None or chat_keys:
                given = chat_keys[0] if chat_keys else tensors.CHAT_OPTIONS.name
                raise InvalidInput(f"{given}: chat options apply to {tensors.MESSAGES.name} requests only")
            return text, self.encoder.encode(text), tensor_images
        if tensor_images:
            raise InvalidInput(
                f"{tensors.IMAGE.name}: with {tensors.MESSAGES.name}, send images as image_url parts of the messages"
            )
        options = parse_chat_options(options_json, parameters, allow_request_template=self.allow_request_template)
        rendered = render_chat(
            self.tokenizer,
            parse_messages(messages),
            options,
            self.chat_template,
            self.image_placeholder,
            self.encoder.encode,
        )
        return rendered.prompt, rendered.token_ids, rendered.image_sources

    def build_request(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> EngineRequest:
        stream, exclude_input = self.stream_and_exclude_input(inputs)
        prompt, token_ids, image_sources = self._prompt(inputs, parameters)
        sampling = self.sampling(inputs, {k: v for k, v in parameters.items() if k not in CHAT_OPTION_KEYS})
        self.fit_to_context(len(token_ids), sampling)
        # Last: decoding is the expensive step, so a request that fails a cheap check never pays for it.
        images = decode_images(image_sources, self.image_limits, "image") if image_sources else []
        return self.engine_request(
            inputs,
            sampling,
            stream=stream,
            echo="" if exclude_input else prompt,
            prompt_token_ids=token_ids,
            images=images or None,
        )

    def fit_to_context(self, prompt_tokens: int, sampling: dict[str, Any]) -> None:
        """A prompt that leaves no room to generate is an error; max_tokens beyond the room left is not.

        The vLLM backend and vLLM itself accept such a max_tokens and stop at the context with finish reason
        `length` (the backend's own CI sends max_tokens 1500 to a smaller context). It is clamped here to what
        the context leaves (with min_tokens, which vLLM requires to be <= max_tokens): the same tokens and
        finish reason as vLLM's stop at the context, and the engine never sees a value it cannot reach. The
        count is the tokenized prompt's: an image placeholder that vLLM expands only makes it an upper bound.
        """
        if self.max_model_len is None:
            return
        if prompt_tokens >= self.max_model_len:
            raise InvalidInput(
                f"prompt is {prompt_tokens} tokens long; the model's context is {self.max_model_len} tokens"
                " and at least one must be left to generate"
            )
        room = self.max_model_len - prompt_tokens
        if sampling.get("max_tokens", self.default_max_tokens) > room:
            sampling["max_tokens"] = room
            if sampling.get("min_tokens", 0) > room:
                sampling["min_tokens"] = room
