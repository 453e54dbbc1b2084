"""preprocess/tokenize.py: the direct Rust path gives transformers' ids, and falls back where it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from preprocess.tokenize import PROBE_TEXTS, TextEncoder

CORPUS = Path(__file__).resolve().parents[2] / "tools" / "corpus" / "tiny_corpus.txt"


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(str(tiny_model))


def test_direct_path_is_taken_for_a_fast_tokenizer(tokenizer) -> None:
    assert TextEncoder(tokenizer).direct


@pytest.mark.parametrize("special", [True, False])
def test_direct_ids_equal_transformers(tokenizer, special: bool) -> None:
    encoder = TextEncoder(tokenizer)
    corpus = CORPUS.read_text(encoding="utf-8")
    texts = [corpus[i : i + 2000] for i in range(0, len(corpus), 1500)][:20]
    texts += ["word " * 300, " ", "\n", "<s>hello</s>", *PROBE_TEXTS]
    for text in texts:
        assert encoder.encode(text, special) == tokenizer.encode(text, add_special_tokens=special)


def test_special_tokens_flag_is_honoured(tiny_model) -> None:
    """The tiny tokenizer adds nothing; given a post-processor that adds BOS (as Llama's does), both paths add it."""
    from tokenizers.processors import TemplateProcessing

    with_bos = AutoTokenizer.from_pretrained(str(tiny_model))
    bos = with_bos.convert_tokens_to_ids(with_bos.bos_token)
    with_bos._tokenizer.post_processor = TemplateProcessing(
        single=f"{with_bos.bos_token} $A", special_tokens=[(with_bos.bos_token, bos)]
    )
    encoder = TextEncoder(with_bos)
    assert encoder.direct
    ids, plain = encoder.encode("Hello there"), encoder.encode("Hello there", False)
    assert ids == [bos, *plain] == with_bos.encode("Hello there")


class _Differs:
    """A tokenizer whose Rust backend disagrees with its own encode: the encoder must keep encode's ids."""

    def __init__(self, real) -> None:
        self._tokenizer = real._tokenizer
        self.real = real

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [7, *self.real.encode(text, add_special_tokens=add_special_tokens)]


def test_a_backend_that_disagrees_is_not_used(tokenizer) -> None:
    encoder = TextEncoder(_Differs(tokenizer))
    assert not encoder.direct
    assert encoder.encode("Hello")[0] == 7


def test_truncation_configured_keeps_transformers_path(tiny_model) -> None:
    truncating = AutoTokenizer.from_pretrained(str(tiny_model))
    truncating._tokenizer.enable_truncation(max_length=4)
    assert not TextEncoder(truncating).direct


class _Slow:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [len(text), int(add_special_tokens)]


def test_a_slow_tokenizer_keeps_its_own_encode() -> None:
    encoder = TextEncoder(_Slow())
    assert not encoder.direct
    assert encoder.encode("abc", False) == [3, 0]
