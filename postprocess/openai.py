"""An OpenAI-style postprocess stage: engine responses -> one `chat_completion` JSON string per response.

A whole answer (the plain ensemble) becomes a `chat.completion`; each streamed delta (the streaming ensemble)
becomes a `chat.completion.chunk` with the new text in `choices[i].delta.content`. The prompt is never echoed
(OpenAI's chat API does not), so `exclude_input_in_output` and the `return_*` flags do not change the output:
finish reasons, token counts (`usage`, whole answers only: a delta knows only its own tokens) and logprobs
(when the request asked for them in `sampling_parameters`) are always part of the document.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.protocol import EngineResponse, SequenceDelta
from postprocess.base import EnginePostprocessor


def _logprobs(seq: SequenceDelta) -> dict[str, Any] | None:
    """OpenAI's `logprobs.content`: per new token its logprob and the top alternatives."""
    if seq.logprobs is None:
        return None
    content = []
    for token_id, position in zip(seq.token_ids, seq.logprobs, strict=False):
        sampled = position.get(str(token_id))
        top = sorted(position.values(), key=lambda entry: entry.rank)
        chosen = sampled if sampled is not None else top[0]
        content.append(
            {
                "token": chosen.decoded_token,
                "logprob": chosen.logprob,
                "top_logprobs": [{"token": entry.decoded_token, "logprob": entry.logprob} for entry in top],
            }
        )
    return {"content": content}


class OpenAIPostprocessor(EnginePostprocessor):
    outputs = (tensors.CHAT_COMPLETION,)

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        # The `model` field of every document: the deployment's public (plain) model name unless set.
        self.model_name = str(settings.get("model_name", ""))

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        document = self.document(self.engine_response(inputs), created=int(time.time()))
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
        return {tensors.CHAT_COMPLETION.name: np.array([text.encode("utf-8")], dtype=np.object_)}

    def document(self, response: EngineResponse, created: int) -> dict[str, Any]:
        header = {"id": f"chatcmpl-{response.request_id}", "created": created, "model": self.model_name}
        # A chunk's choice carries the new text as `delta`, a whole answer's as `message`; otherwise they agree.
        text_key = "delta" if response.streamed else "message"
        choices = [
            {
                "index": seq.index,
                text_key: {"role": "assistant", "content": seq.text},
                "logprobs": _logprobs(seq),
                "finish_reason": seq.finish_reason,
            }
            for seq in response.outputs
        ]
        if response.streamed:
            return {**header, "object": "chat.completion.chunk", "choices": choices}
        completion_tokens = sum(len(seq.token_ids) for seq in response.outputs)
        usage = {
            "prompt_tokens": response.num_input_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": response.num_input_tokens + completion_tokens,
        }
        return {**header, "object": "chat.completion", "choices": choices, "usage": usage}
