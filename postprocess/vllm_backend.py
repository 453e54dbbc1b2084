"""The default postprocess stage: engine responses -> the Triton vLLM backend's output tensors.

Same names, types and semantics as that backend: one element per sequence (n > 1), the prompt prepended when
asked, optional outputs only when their `return_*` input was true, per-response counts when streaming.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.protocol import Position, SequenceDelta
from postprocess.base import EnginePostprocessor


def _position(position: Position | None) -> dict[str, dict] | None:
    if position is None:
        return None
    # Python's json, not msgspec: the vLLM backend's exact text (", " and ": ", ASCII escapes, -Infinity)
    return {
        tid: {"logprob": entry.logprob, "rank": entry.rank, "decoded_token": entry.decoded_token}
        for tid, entry in position.items()
    }


def _positions_json(positions: list[Position | None]) -> str:
    return json.dumps([_position(p) for p in positions])


def logprobs_json(seq: SequenceDelta) -> str:
    """The vLLM backend's logprobs element: a JSON list, per new token, of {token_id: {logprob, rank, ...}}."""
    if seq.logprobs is None:
        return "null"
    return _positions_json(seq.logprobs)


def _strings(texts: Iterable[str]) -> np.ndarray:
    """A TYPE_STRING output tensor: one UTF-8 element per text."""
    return np.array([text.encode("utf-8") for text in texts], dtype=np.object_)


class VllmBackendPostprocessor(EnginePostprocessor):
    outputs = (*tensors.VLLM_BACKEND_OUTPUTS, tensors.STOP_REASON, tensors.PROMPT_LOGPROBS)

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        response = self.engine_response(inputs)
        options = response.postprocess_options
        wanted = set(options.get("return", ()))
        prefix = options.get("prompt_prefix", "")
        seqs = response.outputs

        # Names from the TensorSpecs (core/interface.py), which the rendered configs declare.
        out = {tensors.TEXT_OUTPUT.name: _strings(prefix + s.text for s in seqs)}
        if tensors.RETURN_FINISH_REASON.name in wanted:
            # str(None) == "None" for unfinished sequences, as the vLLM backend sends while streaming.
            out[tensors.FINISH_REASON.name] = _strings(str(s.finish_reason) for s in seqs)
        if tensors.RETURN_CUMULATIVE_LOGPROB.name in wanted:
            out[tensors.CUMULATIVE_LOGPROB.name] = np.array(
                [math.nan if s.cumulative_logprob is None else s.cumulative_logprob for s in seqs], dtype=np.float32
            )
        if tensors.RETURN_LOGPROBS.name in wanted:
            out[tensors.LOGPROBS.name] = _strings(logprobs_json(s) for s in seqs)
        if tensors.RETURN_NUM_INPUT_TOKENS.name in wanted:
            out[tensors.NUM_INPUT_TOKENS.name] = np.array([response.num_input_tokens], dtype=np.uint32)
        if tensors.RETURN_NUM_OUTPUT_TOKENS.name in wanted:
            out[tensors.NUM_OUTPUT_TOKENS.name] = np.array([len(s.token_ids) for s in seqs], dtype=np.uint32)
        if tensors.RETURN_STOP_REASON.name in wanted:
            out[tensors.STOP_REASON.name] = _strings(str(s.stop_reason) for s in seqs)
        if response.prompt_logprobs is not None:  # only the response that carries them (the first one)
            out[tensors.PROMPT_LOGPROBS.name] = _strings([_positions_json(response.prompt_logprobs)])
        return out
