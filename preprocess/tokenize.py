"""Text -> token ids, the ids transformers' own `encode` gives, without its per-call wrapper.

For a fast (Rust) tokenizer, `PreTrainedTokenizerFast.encode` reaches `tokenizers.Tokenizer.encode_batch` through
Python that sets padding and truncation, builds character offsets and a BatchEncoding on every call: ~0.2-0.35 ms
of a ~400-token prompt's 0.7-1.1 ms on the CI machine (docs/performance-gpu.md). `encode_batch_fast` gives
the same ids without offsets, and like `encode_batch` releases the GIL while it runs (the core's preprocess threads
share their interpreter with its engine loop). The ids are compared with transformers' on probe texts at start-up;
a tokenizer that differs on any (or a slow tokenizer, or one with truncation or padding configured) keeps
transformers' path.
"""

from __future__ import annotations

from typing import Any

# Text that exercises what a tokenizer treats specially: leading spaces, newlines, non-ASCII, digits, markup that
# looks like special tokens.
PROBE_TEXTS = (
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnew lines ",
    "Grüße aus München: 3.14159, 2^10 = 1024 — ok? ¿sí? 日本語のテキスト",
    "<s> </s> <unk> <|im_start|>user<|im_end|> [INST] {{ x }} </think>",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment",
    "",
)


class TextEncoder:
    """`encode(text, add_special_tokens)` -> the token ids of `tokenizer.encode(text, add_special_tokens=...)`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._backend = self._direct_backend(tokenizer)

    @property
    def direct(self) -> bool:
        """True when texts go to the Rust tokenizer directly."""
        return self._backend is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._backend is None:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        return self._backend([text], add_special_tokens=add_special_tokens)[0].ids

    @staticmethod
    def _direct_backend(tokenizer: Any) -> Any:
        backend = getattr(tokenizer, "_tokenizer", None)
        if backend is None or getattr(backend, "truncation", None) or getattr(backend, "padding", None):
            return None
        batch = getattr(backend, "encode_batch_fast", None) or getattr(backend, "encode_batch", None)
        if batch is None:
            return None
        for text in PROBE_TEXTS:
            for special in (True, False):
                try:
                    direct = batch([text], add_special_tokens=special)[0].ids
                except Exception:  # noqa: BLE001 - any failure keeps transformers' path
                    return None
                if direct != list(tokenizer.encode(text, add_special_tokens=special)):
                    return None
        return batch
