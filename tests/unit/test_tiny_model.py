"""The default model is built offline and is the same bytes on every build."""

from __future__ import annotations

from pathlib import Path

from tools.build_tiny_model import build


def test_two_builds_are_byte_identical(tmp_path: Path, tiny_model: Path):
    other = build(tmp_path / "again", force=True)
    names = sorted(p.name for p in tiny_model.iterdir())
    assert names == sorted(p.name for p in other.iterdir())
    for name in names:
        assert (tiny_model / name).read_bytes() == (other / name).read_bytes(), name


def test_tokenizer_round_trips_multibyte_text(tiny_model: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "Grüße 你好 😀 — Привет 🦀 龘"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    # Some characters must take more than one token, or streaming never splits a character.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
