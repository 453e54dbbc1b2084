"""Per-request token windows the core attaches to each delta so postprocess can detokenize it (ids only).

The engine process does not decode text (vLLM runs with `detokenize=False`); postprocess replays vLLM's
incremental detokenizer from the last *sync token* before a delta's new tokens (core/token_sync.py says
what a sync token is and why that is exact). Here that is a set lookup per token and a bisect per delta.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from core.token_sync import LOGPROB_CONTEXT

# vLLM's defaults of the sampling parameters that change how ids become text; responses carry only the others
# (every byte of an engine response costs CPU in the engine process, once per streamed delta).
DECODE_DEFAULTS = {
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
}


def decode_options(sampling: Any) -> dict[str, bool]:
    """EngineResponse.decode for vLLM SamplingParams: the decoding options that differ from vLLM's defaults."""
    return {
        key: getattr(sampling, key) for key, default in DECODE_DEFAULTS.items() if getattr(sampling, key) != default
    }


class TokenWindows:
    def __init__(self, prompt_ids: list[int], sync_ids: frozenset[int], logprobs: bool) -> None:
        self.prompt = list(prompt_ids)
        self.sync_ids = sync_ids
        # logprobs' decoded tokens look back at up to LOGPROB_CONTEXT sampled tokens (vLLM's rule)
        self.lookback = LOGPROB_CONTEXT if logprobs else 1
        # A sequence's first window starts at the prompt's last sync position (next_window's limit only grows), and
        # only a prompt that ends in a sync token has one to start from: the prompt's text may otherwise end in
        # U+FFFD, DecodeStream then holds the whole prompt as not yet emitted, and vLLM's first emission repeats all
        # of it (measured). Until an output sync token, send the whole prompt. (No scan of the prompt: per request,
        # on the engine loop.)
        self._prompt_syncs = [len(self.prompt) - 1] if self.prompt and self.prompt[-1] in sync_ids else []
        # sequence index -> (output ids so far, sync positions in prompt + output that may still be needed)
        self._sequences: dict[int, tuple[list[int], list[int]]] = {}

    def next_window(self, index: int, new_ids: list[int]) -> tuple[list[int], int]:
        """(context ids, how many of them are prompt ids) for the delta `new_ids` of sequence `index`."""
        state = self._sequences.get(index)
        if state is None:
            state = self._sequences[index] = ([], list(self._prompt_syncs))
        output, syncs = state
        num_prompt, done = len(self.prompt), len(output)
        limit = num_prompt + done - (1 if done <= 1 else min(self.lookback, done))
        k = bisect_right(syncs, limit)
        start = syncs[k - 1] if k else 0
        if k > 1:
            del syncs[: k - 1]  # the limit only grows: older sync positions are never used again
        context = self.prompt[start:] + output if start < num_prompt else output[start - num_prompt :]
        sync_ids, position = self.sync_ids, num_prompt + done
        for offset, token_id in enumerate(new_ids):
            if token_id in sync_ids:
                syncs.append(position + offset)
        output.extend(new_ids)
        return context, max(0, num_prompt - start)
