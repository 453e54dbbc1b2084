"""Build a tiny LoRA adapter for the default model offline, deterministically (no peft needed).

Writes the two files vLLM reads, in peft's format: `adapter_config.json` and `adapter_model.safetensors`
(`base_model.model.model.layers.{i}.self_attn.{q,v}_proj.lora_{A,B}.weight`). Both matrices are random from a
fixed seed (peft would start B at zero, which changes nothing), scaled so that greedy output differs from the
base model's. Same bytes on every build; a stamp file makes a second run return at once.

    python tools/build_tiny_lora.py [--out models/tiny-llama-lora] [--force]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import offline_build  # noqa: E402
from tools.build_tiny_model import DEFAULT_OUT as BASE_MODEL  # noqa: E402

DEFAULT_OUT = ROOT / "models" / "tiny-llama-lora"
RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
SEED = 4321
SCALE = 0.5


def build(out: Path = DEFAULT_OUT, base: Path = BASE_MODEL, force: bool = False) -> Path:
    out = Path(out)
    want = offline_build.digest_of(Path(__file__))
    if not force and offline_build.is_built(out, want):
        return out
    import numpy as np
    from safetensors.numpy import save_file

    config = json.loads((Path(base) / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    out_dims = {"q_proj": config["num_attention_heads"] * head_dim, "v_proj": config["num_key_value_heads"] * head_dim}
    rng = np.random.default_rng(SEED)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((RANK, hidden)) * SCALE).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out_dims[target], RANK)) * SCALE).astype(
                np.float32
            )
    adapter_config = {
        "base_model_name_or_path": "tiny-llama",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": RANK,
        "target_modules": list(TARGETS),
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    save_file(dict(sorted(tensors.items())), str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    offline_build.mark_built(out, want)
    return out


if __name__ == "__main__":
    sys.exit(offline_build.main(__doc__, DEFAULT_OUT, build, "tiny LoRA adapter"))
