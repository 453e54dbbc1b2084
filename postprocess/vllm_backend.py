"""The default postprocess stage: engine responses -> the Triton vLLM backend's output tensors.

Same names, types and semantics as that backend: one element per sequence (n > 1), the prompt prepended when
asked, optional outputs only when their `return_*` input was true, per-response counts when streaming.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from core import interface as tensors
from core.protocol import SequenceDelta
from postprocess.base import EnginePostprocessor


def _position(position: dict[str, list] | None) -> dict[str, dict] | None:
    if position is None:
        return None
    return {tid: {"logprob": lp, "rank": rank, "decoded_token": text} for tid, (lp, rank, text) in position.items()}


def _positions_json(positions: list[dict[str, list] | None]) -> str:
    return json.dumps([_position(p) for p in positions])


def logprobs_json(seq: SequenceDelta) -> str:
    """The vLLM backend's logprobs element: a JSON list, per new token, of {token_id: {logprob, rank, ...}}."""
    if seq.logprobs is None:
        return "null"
    return _positions_json(seq.logprobs)


class VllmBackendPostprocessor(EnginePostprocessor):
    outputs = (*tensors.VLLM_BACKEND_OUTPUTS, tensors.STOP_REASON, tensors.PROMPT_LOGPROBS)

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        response = self.engine_response(inputs)
        options = response.postprocess_options
        wanted = set(options.get("return", ()))
        prefix = options.get("prompt_prefix", "")
        seqs = response.outputs

        out: dict[str, np.ndarray] = {
            "text_output": np.array([(prefix + s.text).encode("utf-8") for s in seqs], dtype=np.object_)
        }
        if "return_finish_reason" in wanted:
            # str(None) == "None" for unfinished sequences, as the vLLM backend sends while streaming.
            out["finish_reason"] = np.array([str(s.finish_reason).encode() for s in seqs], dtype=np.object_)
        if "return_cumulative_logprob" in wanted:
            out["cumulative_logprob"] = np.array(
                [math.nan if s.cumulative_logprob is None else s.cumulative_logprob for s in seqs], dtype=np.float32
            )
        if "return_logprobs" in wanted:
            out["logprobs"] = np.array([logprobs_json(s).encode("utf-8") for s in seqs], dtype=np.object_)
        if "return_num_input_tokens" in wanted:
            out["num_input_tokens"] = np.array([response.num_input_tokens], dtype=np.uint32)
        if "return_num_output_tokens" in wanted:
            out["num_output_tokens"] = np.array([len(s.token_ids) for s in seqs], dtype=np.uint32)
        if "return_stop_reason" in wanted:
            out["stop_reason"] = np.array([str(s.stop_reason).encode("utf-8") for s in seqs], dtype=np.object_)
        if response.prompt_logprobs is not None:  # only the response that carries them (the first one)
            out["prompt_logprobs"] = np.array([_positions_json(response.prompt_logprobs).encode("utf-8")], np.object_)
        return out
