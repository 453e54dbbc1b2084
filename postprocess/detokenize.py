"""Detokenization outside the engine process, exactly as vLLM 0.32 does it inside (shared by every postprocess stage).

The core sends token ids with a window of context ids that starts at a *sync token* (core/token_sync.py says
what that is and why it makes this exact). `detokenize` primes a fresh DecodeStream at that sync token and
replays the same steps vLLM took (a reset when the stream reports an invalid prefix, the special-token spacing
rule), so each delta gets exactly the text vLLM's engine would have emitted for it. The replay window is a few
tokens for real text; it grows only over runs of tokens that do not form text (broken UTF-8, special tokens).

`detokenize(response, detokenizer)` fills `SequenceDelta.text` and the logprobs' `decoded_token` in place; every
postprocess stage calls it first, then reads `seq.text` as before. Responses the engine already detokenized
(requests with stop strings, tokenizers without a sync table) pass through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from core.protocol import EngineResponse, Position, SequenceDelta
from core.token_sync import LOGPROB_CONTEXT, REPLACEMENT, raw_tokenizer, uses_decode_stream


class _Stream:
    """vLLM's FastIncrementalDetokenizer.decode_next, primed with `prefill` instead of the whole prompt."""

    def __init__(self, raw: Any, prefill: list[int], skip_special: bool, spaces_between_special: bool) -> None:
        from tokenizers.decoders import DecodeStream

        self._decode_stream = DecodeStream
        self.raw = raw
        self.skip_special = skip_special
        self.stream = DecodeStream(ids=prefill, skip_special_tokens=skip_special)
        self.added: dict[int, str] | None = None
        if not (skip_special or spaces_between_special):
            added = {tid: tok.content for tid, tok in raw.get_added_tokens_decoder().items()}
            self.added = added or None
        self.last_special = False

    def step(self, token_id: int) -> str:
        try:
            text = self.stream.step(self.raw, token_id)
        except (OverflowError, TypeError):
            text = None  # vLLM logs and skips an invalid id (vllm issue 21951)
        except Exception as exc:
            if not str(exc).startswith("Invalid prefix encountered"):
                raise
            # vLLM restarts the stream without context when the decoded text stops extending the old text.
            self.stream = self._decode_stream(skip_special_tokens=self.skip_special)
            text = self.stream.step(self.raw, token_id)
        if self.added is not None:
            special = self.added.get(token_id)
            if special is not None and self.last_special:
                text = special
            self.last_special = special is not None
        return text or ""


class Detokenizer:
    """What `detokenize` needs of a tokenizer, computed once: the raw tokenizer and the space marker."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.raw = raw_tokenizer(tokenizer)
        config = json.loads(self.raw.to_str())
        pre = config.get("pre_tokenizer") or {}
        subs = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
        # vLLM's get_leading_space_marker: only Metaspace pre-tokenizers lose a leading space in decode().
        self.space_marker = next((s.get("replacement", "\u2581") for s in subs if s.get("type") == "Metaspace"), None)
        self._single: dict[int, str] = {}

    # Logprobs' decoded_token: vLLM's convert_ids_list_to_tokens + LogprobsProcessor._verify_tokens.

    def _decode_one(self, token_id: int) -> str:
        text = self._single.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) or ""
            if self.space_marker is not None:
                raw_piece = self.tokenizer.convert_ids_to_tokens([token_id])[0] or ""
                markers = len(raw_piece) - len(raw_piece.lstrip(self.space_marker))
                missing = markers - (len(text) - len(text.lstrip(" ")))
                if markers and missing > 0:
                    text = " " * missing + text
            if len(self._single) < 1_000_000:
                self._single[token_id] = text
        return text

    def _correct(self, token_id: int, context: list[int]) -> str:
        decode = self.tokenizer.decode
        for num_ctx in range(1, min(len(context), LOGPROB_CONTEXT) + 1):
            ctx = context[-num_ctx:]
            full = decode(ctx + [token_id])
            if full.endswith(REPLACEMENT):
                continue
            clean_end = len(ctx)
            for j in range(len(ctx) - 1, -1, -1):
                if decode([ctx[j]]).endswith(REPLACEMENT):
                    clean_end = j
                else:
                    break
            prefix = decode(ctx[:clean_end]) if clean_end > 0 else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""

    def decoded_tokens(self, token_ids: Iterable[int], context: list[int]) -> list[str]:
        texts = []
        for token_id in token_ids:
            text = self._decode_one(token_id)
            texts.append(self._correct(token_id, context) if text.endswith(REPLACEMENT) else text)
        return texts

    def fill_logprobs(self, positions: list[Position | None], context: list[int]) -> None:
        """Set decoded_token of each entry; `context` is the sampled ids before the first position."""
        context = context[-LOGPROB_CONTEXT:]
        for position in positions:
            if position is None:
                continue
            ids = [int(t) for t in position]
            for entry, text in zip(position.values(), self.decoded_tokens(ids, context), strict=True):
                entry.decoded_token = text
            context = (context + ids[:1])[-LOGPROB_CONTEXT:]

    # Text.

    def sequence_text(self, seq: SequenceDelta, decode: dict[str, Any]) -> str:
        context = seq.context_ids or []
        num_prompt = seq.context_prompt_tokens
        if num_prompt > 0:
            prefill, replay = context[:num_prompt], context[num_prompt:]
        else:  # the window starts at a sync token of the output: it stands for everything before it
            prefill, replay = context[:1], context[1:]
        # `decode` carries only what differs from vLLM's defaults (core/token_windows.py: DECODE_DEFAULTS)
        stream = _Stream(
            self.raw,
            prefill,
            decode.get("skip_special_tokens", True),
            decode.get("spaces_between_special_tokens", True),
        )
        if num_prompt == 0 and context:
            # the sync token itself was an output token: vLLM's special-token spacing state saw it
            stream.last_special = False
        for token_id in replay:
            stream.step(token_id)
        new_ids = seq.token_ids
        if seq.finish_reason == "stop" and not decode.get("include_stop_str_in_output", False):
            new_ids = new_ids[:-1]  # vLLM does not detokenize the EOS / stop token id that ended the sequence
        return "".join(stream.step(token_id) for token_id in new_ids)


class NoDetokenizer:
    """The detokenizer of a stage without a `tokenizer` setting: a null object, as vLLM's base
    IncrementalDetokenizer is for requests it does not detokenize. Responses the engine decoded pass through
    `detokenize` without reaching it; ids to decode are an error, since the engine sends them only when the
    deployment gave postprocess the tokenizer."""

    MISSING = "the engine sent token ids to decode but this stage has no 'tokenizer' setting"

    def sequence_text(self, seq: SequenceDelta, decode: dict[str, Any]) -> str:
        raise RuntimeError(self.MISSING)

    def fill_logprobs(self, positions: list[Position | None], context: list[int]) -> None:
        raise RuntimeError(self.MISSING)


def load_detokenizer(settings: dict[str, Any]) -> Detokenizer | NoDetokenizer:
    """The detokenizer of a postprocess stage's settings (`tokenizer`: the engine's tokenizer path or name)."""
    path = settings.get("tokenizer")
    if path is None:
        return NoDetokenizer()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # The engine keeps decoding for other tokenizers (no sync table), so it never asks this stage to.
    return Detokenizer(tokenizer) if uses_decode_stream(tokenizer) else NoDetokenizer()


def detokenize(response: EngineResponse, detokenizer: Detokenizer | NoDetokenizer) -> EngineResponse:
    """Fill the text and logprob tokens of a response whose ids the engine did not decode (in place; idempotent)."""
    decode = response.decode
    if decode is None:
        return response
    for seq in response.outputs:
        output_context = (seq.context_ids or [])[seq.context_prompt_tokens :]
        seq.text = detokenizer.sequence_text(seq, decode)
        if seq.logprobs is not None:
            detokenizer.fill_logprobs(seq.logprobs, output_context)
        seq.context_ids = None
        seq.context_prompt_tokens = 0
    if response.prompt_logprobs is not None:
        detokenizer.fill_logprobs(response.prompt_logprobs, [])
    response.decode = None
    return response
