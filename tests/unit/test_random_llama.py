"""tools/build_random_llama.py: the shape asked for, the tiny tokenizer, a stamp that skips only unchanged builds."""

from __future__ import annotations

import json
from pathlib import Path

from tools.build_random_llama import build

TINY_SHAPE = {"layers": 1, "hidden": 64, "intermediate": 128, "heads": 4, "kv_heads": 2}


def test_builds_the_shape_once_and_again_when_the_shape_changes(tmp_path: Path):
    out = build(tmp_path / "llama", TINY_SHAPE)
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (1, 64, 2)
    from transformers import AutoTokenizer

    assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(out))  # the tokenizer travels with it
    weights = out / "model.safetensors"
    first = weights.stat().st_mtime_ns
    build(out, TINY_SHAPE)
    assert weights.stat().st_mtime_ns == first  # unchanged script and shape: skipped
    build(out, {**TINY_SHAPE, "layers": 2})
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2


def test_a_larger_vocabulary_than_the_tokenizers(tmp_path: Path):
    out = build(tmp_path / "llama", {**TINY_SHAPE, "vocab": 4000})
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 4000
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        assert weights.get_slice("lm_head.weight").get_shape() == [4000, 64]
