"""A random-weight Llama of a real model's shape, for GPU benchmarks without a download.

    python tools/build_random_llama.py [--out DIR] [--force] [--layers 16 --hidden 2048 --intermediate 8192
                                       --heads 32 --kv-heads 8 --vocab 0]

The default shape is Llama-3.2-1B's (0.98 B parameters in bf16) with the tiny model's BPE tokenizer and chat
template (tools/build_tiny_model.py, built first if missing), written to models/llama-1b: the checkpoint that
deployments/examples/gpu-bench-1b.yaml serves. Llama-3.1-8B's shape: --layers 32 --hidden 4096
--intermediate 14336 --heads 32 --kv-heads 8 --vocab 128256 (8.0 B parameters; models/llama-8b is what
deployments/examples/gpu-llama-8b-local.yaml serves). Real GPU work per step; the text it writes is nonsense. A build is
skipped while this script and the shape are unchanged (tools/offline_build.py's stamp).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import offline_build  # noqa: E402
from tools.build_tiny_model import DEFAULT_OUT as TINY_MODEL  # noqa: E402
from tools.build_tiny_model import build as build_tiny_model  # noqa: E402

DEFAULT_OUT = ROOT / "models" / "llama-1b"
SHAPE_1B = {"layers": 16, "hidden": 2048, "intermediate": 8192, "heads": 32, "kv_heads": 8}


def build(out: Path, shape: dict[str, int], force: bool = False) -> Path:
    want = offline_build.digest_of(Path(__file__)) + "-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    if not force and offline_build.is_built(out, want):
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(TINY_MODEL))
    # A vocabulary larger than the tokenizer's (e.g. Llama 3's 128256) gives the real embedding and lm_head cost;
    # the extra rows are ids the tokenizer never produces.
    vocab_size = max(shape.get("vocab", 0), len(tokenizer))
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)  # greedy output varies instead of one repeated token
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation) + "\n")  # no sampling overrides
    offline_build.mark_built(out, want)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    for key, default in SHAPE_1B.items():
        parser.add_argument("--" + key.replace("_", "-"), type=int, default=default)
    parser.add_argument("--vocab", type=int, default=0, help="vocabulary size (default: the tokenizer's)")
    args = parser.parse_args(argv)
    shape = {key: getattr(args, key) for key in SHAPE_1B}
    if args.vocab:
        shape["vocab"] = args.vocab
    out = build(args.out.resolve(), shape, force=args.force)
    print(f"random Llama ready in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
