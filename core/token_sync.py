"""The sync-token rule: the contract between the engine, which sends token ids, and postprocess, which decodes them.

vLLM's engine turns token ids into text with `FastIncrementalDetokenizer` (vllm/v1/engine/detokenizer.py): a
`tokenizers.decoders.DecodeStream` primed with the prompt ids and stepped once per output token. Its state is a
window of ids whose extent depends on the decoded bytes, so it cannot be computed from ids alone. Sync tokens
make a stateless postprocess exact anyway:

* A *sync token* is a plain vocabulary token after which the stream's future output no longer depends on what
  came before: it always completes an emission (its text is non-empty and whole: no U+FFFD, not a
  byte-fallback piece, not an added/special token), and for the decoders handled here (byte-level BPE;
  SentencePiece-style Metaspace / Replace + ByteFallback + Fuse + Strip) the text of later tokens is appended
  to the text before it. `sync_token_ids` lists them once per tokenizer (the core loads it at start-up).
* The core (which must not decode text, core/token_windows.py) sends with every delta `context_ids`: the ids
  from the last sync token before the delta's new tokens (or from the start of the prompt when there is none),
  looked up by id only.
* Postprocess (postprocess/detokenize.py) primes a fresh DecodeStream at that sync token and replays the steps
  vLLM took, so each delta gets exactly the text vLLM's engine would have emitted for it.

Both sides import this module; it lives in core/ beside protocol.py so that neither depends on the other.
"""

from __future__ import annotations

import json
import re
from typing import Any

REPLACEMENT = "\ufffd"
_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
# Decoder steps whose output for later tokens is appended to the output for earlier ones (see the module doc).
_SENTENCEPIECE_STEPS = frozenset({"Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"})
# vLLM's logprobs processor looks back this many sampled tokens to repair a decoded token (logprobs.py): the
# core's windows reach that far back when logprobs were asked, and postprocess repairs with as many.
LOGPROB_CONTEXT = 4


def raw_tokenizer(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind a transformers tokenizer (what vLLM's DecodeStream steps with)."""
    return getattr(tokenizer, "_tokenizer", None) or getattr(tokenizer, "backend_tokenizer", None)


def uses_decode_stream(tokenizer: Any) -> bool:
    """vLLM's own test (detokenizer.uses_fast_detokenizer): other tokenizers take its slow path, not reproduced."""
    try:
        from transformers import TokenizersBackend
    except ImportError:
        return False
    return isinstance(tokenizer, TokenizersBackend) and raw_tokenizer(tokenizer) is not None


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
    raw = raw_tokenizer(tokenizer)
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
