"""The documents that travel between the stages: `engine_request` (preprocess -> core) and `engine_response`
(core -> postprocess, one per delta when streaming). Both are JSON in a one-element STRING tensor.

`postprocess_options` is opaque to the core: it is copied into every response, because in the streaming
ensemble the postprocess step may only consume tensors that come from the core (docs/platform-notes.md T2).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineRequest:
    sampling: dict[str, Any]
    prompt_token_ids: list[int] | None = None
    prompt: str | None = None  # used by the core only when prompt_token_ids is None (raw-text preprocess)
    stream: bool = False
    lora_name: str | None = None
    # Decoded, size-checked images for vLLM's multi_modal_data: {"width", "height", "rgb"} with `rgb` the raw
    # RGB pixels (row-major, base64). Preprocess decodes; the engine process only wraps the pixels.
    images: list[dict[str, Any]] | None = None
    postprocess_options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(vars(self), ensure_ascii=False, separators=(",", ":"))  # flat: no asdict deep copy

    @classmethod
    def from_json(cls, text: str | bytes) -> EngineRequest:
        return cls(**json.loads(text))


@dataclass
class SequenceDelta:
    """New output of one sequence (index < n) since the previous response of the same request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" once the sequence is finished
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    # One entry per new token: {token_id: [logprob, rank, decoded_token]}; None when logprobs were not asked.
    logprobs: list[dict[str, list]] | None = None
    # When the engine did not detokenize (EngineResponse.decode is set): the ids before `token_ids` that
    # postprocess/detokenize.py needs to decode them, the first `context_prompt_tokens` of them from the prompt.
    context_ids: list[int] | None = None
    context_prompt_tokens: int = 0


@dataclass
class EngineResponse:
    outputs: list[SequenceDelta]
    num_input_tokens: int
    finished: bool
    postprocess_options: dict[str, Any] = field(default_factory=dict)
    # The engine's request id (every delta of one request carries the same) and whether this response is one
    # streamed delta (False for a whole answer, also after merge_responses): the OpenAI-style postprocess needs
    # both to tell a `chat.completion.chunk` of a stream from a `chat.completion`.
    request_id: str = ""
    streamed: bool = False
    # Set when `text` and logprobs' decoded tokens are still to be made from the ids (postprocess/detokenize.py):
    # those of vLLM's skip_special_tokens, spaces_between_special_tokens, include_stop_str_in_output that differ
    # from vLLM's defaults (usually {}). None: the engine detokenized.
    decode: dict[str, bool] | None = None
    # Per prompt position (the first is null), as `logprobs`; in the first response only, when asked.
    prompt_logprobs: list[dict[str, list] | None] | None = None

    def to_json(self) -> str:
        # vars(), not dataclasses.asdict: asdict deep-copies every list, and this runs once per streamed delta.
        doc = {**vars(self), "outputs": [vars(seq) for seq in self.outputs]}
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> EngineResponse:
        doc = json.loads(text)
        doc["outputs"] = [SequenceDelta(**o) for o in doc["outputs"]]
        return cls(**doc)


def merge_responses(responses: list[EngineResponse], streamed: bool = False) -> EngineResponse:
    """Fold a request's consecutive deltas into one response, as if the engine had answered once after the last.

    `streamed=False` gives a whole answer (the plain path); True gives one larger streamed delta (the core
    coalescing a stream's queued deltas)."""
    if not responses:
        raise ValueError("no responses to merge")
    merged: dict[int, SequenceDelta] = {}
    for response in responses:
        for delta in response.outputs:
            seq = merged.get(delta.index)
            if seq is None:
                merged[delta.index] = SequenceDelta(
                    delta.index,
                    delta.text,
                    list(delta.token_ids),
                    delta.finish_reason,
                    delta.stop_reason,
                    delta.cumulative_logprob,
                    list(delta.logprobs) if delta.logprobs is not None else None,
                    delta.context_ids,
                    delta.context_prompt_tokens,
                )
                continue
            if not seq.token_ids:  # a quiet first delta (n > 1): the first one with tokens has the window to use
                seq.context_ids, seq.context_prompt_tokens = delta.context_ids, delta.context_prompt_tokens
            seq.text += delta.text
            seq.token_ids.extend(delta.token_ids)
            seq.finish_reason = delta.finish_reason
            seq.stop_reason = delta.stop_reason
            seq.cumulative_logprob = delta.cumulative_logprob
            if delta.logprobs is not None:
                seq.logprobs = (seq.logprobs or []) + delta.logprobs
    last = responses[-1]
    return EngineResponse(
        outputs=[merged[i] for i in sorted(merged)],
        num_input_tokens=last.num_input_tokens,
        finished=last.finished,
        postprocess_options=last.postprocess_options,
        request_id=last.request_id,
        streamed=streamed,
        decode=last.decode,
        prompt_logprobs=next((r.prompt_logprobs for r in responses if r.prompt_logprobs is not None), None),
    )
