"""Build the project's default model offline: a tiny random Llama with a BPE tokenizer and a ChatML template.

Nothing is downloaded. The tokenizer is trained on `tools/corpus/tiny_corpus.txt` (shipped with the project,
with multi-byte UTF-8 text so that streamed output exercises split characters), and the weights come from a
fixed seed, so every build writes the same bytes. A stamp file makes a second run return at once.

    python tools/build_tiny_model.py [--out models/tiny-llama] [--force]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import offline_build  # noqa: E402

CORPUS = ROOT / "tools" / "corpus" / "tiny_corpus.txt"
DEFAULT_OUT = ROOT / "models" / "tiny-llama"

BOS, EOS, PAD = "<s>", "<|im_end|>", "<pad>"
SPECIAL_TOKENS = [BOS, "</s>", PAD, "<|im_start|>", EOS]
VOCAB_TARGET = 2048
SEED = 1234

# ChatML, as used by many instruction-tuned models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _inputs_digest() -> str:
    return offline_build.digest_of(Path(__file__), CORPUS)


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    tokenizer.train_from_iterator(lines, trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def llama_config(tokenizer, **extra: Any) -> Any:
    """The tiny Llama shape over `tokenizer` (also the language model of tools/build_tiny_llava.py)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        **extra,
    )


def build_model(out: Path, tokenizer) -> None:
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(tokenizer, torch_dtype="float32")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # The default init (std 0.02) gives near-uniform logits, and greedy decoding then repeats one token.
        # Larger embedding and output weights make greedy output vary with the prompt.
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.35)
    model.save_pretrained(out, safe_serialization=True)
    generation_config = out / "generation_config.json"
    if generation_config.exists():
        # Keep vLLM's defaults neutral: no sampling overrides from the checkpoint.
        generation_config.write_text(
            json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id}, indent=2) + "\n"
        )


def build(out: Path, force: bool = False) -> Path:
    want = _inputs_digest()
    if not force and offline_build.is_built(out, want):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    offline_build.mark_built(out, want)
    return out


if __name__ == "__main__":
    sys.exit(offline_build.main(__doc__, DEFAULT_OUT, build, "tiny model"))
