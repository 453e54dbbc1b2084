"""A random-weight Llama of a real model's shape, for GPU benchmarks without a download.

    python tools/build_random_llama.py [OUT] [--layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8]

The default shape is Llama-3.2-1B's (0.98 B parameters in bf16) with the project's tiny BPE tokenizer and chat
template (models/tiny-llama, from tools/build_tiny_model.py), written to models/llama-1b: the checkpoint that
deployments/examples/gpu-bench-1b.yaml serves. Llama-3.1-8B's shape: --layers 32 --hidden 4096
--intermediate 14336 --heads 32 --kv-heads 8. Real GPU work per step; the text it writes is nonsense.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, default=ROOT / "models" / "llama-1b")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "models" / "tiny-llama")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    args = parser.parse_args(argv)
    if (args.out / "config.json").exists():
        print(f"exists: {args.out}")
        return 0

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
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
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    (args.out / "generation_config.json").write_text(json.dumps(generation))
    print(f"built {args.out}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
