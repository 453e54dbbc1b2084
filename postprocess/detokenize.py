"""Detokenization outside the engine process, exactly as vLLM 0.32 does it inside (shared by every postprocess stage).

vLLM's engine turns token ids into text with `FastIncrementalDetokenizer` (vllm/v1/engine/detokenizer.py): a
`tokenizers.decoders.DecodeStream` primed with the prompt ids and stepped once per output token, plus a reset
when the stream reports an invalid prefix and a special-token spacing rule. Its state is a window of ids
(the ids of the last emitted piece plus the ids not emitted yet), and which ids sit in that window depends on
the decoded bytes, so it cannot be computed from ids alone. This module keeps the postprocess stateless anyway:

* A *sync token* is a plain vocabulary token after which the stream's future output no longer depends on what
  came before: it always completes an emission (its text is non-empty and whole: no U+FFFD, not a
  byte-fallback piece, not an added/special token), and for the decoders handled here (byte-level BPE;
  SentencePiece-style Metaspace / Replace + ByteFallback + Fuse + Strip) the text of later tokens is appended
  to the text before it. `sync_token_ids` lists them once per tokenizer (the core loads it at start-up).
* The core (which must not decode text) sends with every delta `context_ids`: the ids from the last sync token
  before the delta's new tokens (or from the start of the prompt when there is none), looked up by id only.
* `detokenize` primes a fresh DecodeStream at that sync token and replays the same steps vLLM took, so each
  delta gets exactly the text vLLM's engine would have emitted for it. The replay window is a few tokens for
  real text; it grows only over runs of tokens that do not form text (broken UTF-8, special tokens).

`detokenize(response, tokenizer)` fills `SequenceDelta.text` and the logprobs' `decoded_token` in place; every
postprocess stage calls it first, then reads `seq.text` as before. Responses the engine already detokenized
(requests with stop strings, tokenizers without a sync table) pass through unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from core.protocol import EngineResponse, SequenceDelta

REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# Decoder steps whose output for later tokens is appended to the output for earlier ones (see the module doc).
_SENTENCEPIECE_STEPS = frozenset({"Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"})
# vLLM's logprobs processor looks back this many sampled tokens to repair a decoded token (logprobs.py).
LOGPROB_CONTEXT = 4


def _raw(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a transformers tokenizer (what vLLM's DecodeStream steps with)."""
    return getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)


def uses_decode_stream(tokenizer: Any) -> bool:
    """vLLM's own test (detokenizer.uses_fast_detokenizer): other tokenizers take its slow path, not reproduced."""
    try:
        from transformers import TokenizersBackend
    except ImportError:
        return False
    return isinstance(tokenizer, TokenizersBackend) and _raw(tokenizer) is not None


def _decoder_kind(config: dict[str, Any]) -> str | None:
    decoder = config.get("decoder") or {}
    kind = decoder.get("type")
    if kind == "ByteLevel":
        return "byte_level"
    steps = [d.get("type") for d in decoder.get("decoders", [])] if kind == "Sequence" else [kind]
    if steps and set(steps) <= _SENTENCEPIECE_STEPS:
        return "sentencepiece"
    return None


def sync_token_ids(tokenizer: Any) -> frozenset[int] | None:
    """The tokenizer's sync tokens, or None when the engine must keep detokenizing (unsupported tokenizer).

    Called once at start-up (one decode per vocabulary entry); the core then needs only set lookups.
    """
    if not uses_decode_stream(tokenizer):
        return None
    raw = _raw(tokenizer)
    kind = _decoder_kind(json.loads(raw.to_str()))
    if kind is None:
        return None
    added = set(raw.get_added_tokens_decoder())
    sync = set()
    for token_id in range(raw.get_vocab_size(with_added_tokens=True)):
        if token_id in added:
            continue
        piece = raw.id_to_token(token_id)
        if not piece or (kind == "sentencepiece" and _BYTE_FALLBACK.match(piece)):
            continue
        text = raw.decode([token_id], skip_special_tokens=False)
        if text and REPLACEMENT not in text:
            sync.add(token_id)
    return frozenset(sync)


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
        self.raw = _raw(tokenizer)
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

    def fill_logprobs(self, positions: list[dict[str, list] | None], context: list[int]) -> None:
        """Set decoded_token (element 2) of each entry; `context` is the sampled ids before the first position."""
        context = context[-LOGPROB_CONTEXT:]
        for position in positions:
            if position is None:
                continue
            ids = [int(t) for t in position]
            for entry, text in zip(position.values(), self.decoded_tokens(ids, context), strict=True):
                entry[2] = text
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


def load_detokenizer(settings: dict[str, Any]) -> Detokenizer | None:
    """The detokenizer of a postprocess stage's settings (`tokenizer`: the engine's tokenizer path or name)."""
    path = settings.get("tokenizer")
    if path is None:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # The engine keeps decoding for other tokenizers (no sync table), so it never asks this stage to.
    return Detokenizer(tokenizer) if uses_decode_stream(tokenizer) else None


def detokenize(response: EngineResponse, detokenizer: Detokenizer) -> EngineResponse:
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
