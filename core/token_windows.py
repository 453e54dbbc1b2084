"""Per-request token windows the core attaches to each delta so postprocess can detokenize it (ids only).

The engine process does not decode text (vLLM runs with `detokenize=False`); postprocess replays vLLM's
incremental detokenizer from the last *sync token* before a delta's new tokens (postprocess/detokenize.py says
what a sync token is and why that is exact). Here that is a set lookup per token and a bisect per delta.
"""

from __future__ import annotations

from bisect import bisect_right

from postprocess.detokenize import LOGPROB_CONTEXT


class TokenWindows:
    def __init__(self, prompt_ids: list[int], sync_ids: frozenset[int], logprobs: bool) -> None:
        self.prompt = list(prompt_ids)
        self.sync_ids = sync_ids
        # logprobs' decoded tokens look back at up to LOGPROB_CONTEXT sampled tokens (vLLM's rule)
        self.lookback = LOGPROB_CONTEXT if logprobs else 1
        self._prompt_syncs = [i for i, t in enumerate(self.prompt) if t in sync_ids]
        if self.prompt and self.prompt[-1] not in sync_ids:
            # The prompt's text may end in U+FFFD: DecodeStream then holds the whole prompt as not yet emitted, and
            # vLLM's first emission repeats all of it (measured). Until an output sync token, send the whole prompt.
            self._prompt_syncs = []
        self._outputs: dict[int, list[int]] = {}  # sequence index -> output ids so far
        self._syncs: dict[int, list[int]] = {}  # sequence index -> sync positions in prompt + output

    def next_window(self, index: int, new_ids: list[int]) -> tuple[list[int], int]:
        """(context ids, how many of them are prompt ids) for the delta `new_ids` of sequence `index`."""
        output = self._outputs.setdefault(index, [])
        syncs = self._syncs.setdefault(index, list(self._prompt_syncs))
        num_prompt, done = len(self.prompt), len(output)
        limit = num_prompt + done - max(1, min(self.lookback, done))
        k = bisect_right(syncs, limit)
        start = syncs[k - 1] if k else 0
        if k > 1:
            del syncs[: k - 1]  # the limit only grows: older sync positions are never used again
        context = self.prompt[start:] + output if start < num_prompt else output[start - num_prompt :]
        for offset, token_id in enumerate(new_ids):
            if token_id in self.sync_ids:
                syncs.append(num_prompt + done + offset)
        output.extend(new_ids)
        return context, max(0, num_prompt - start)
