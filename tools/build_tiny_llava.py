"""Build a tiny LLaVA offline: a CLIP vision tower (56 px images, 14 px patches) + a tiny Llama, random weights.

Nothing is downloaded. The tokenizer is the default tiny model's (tools/build_tiny_model.py, trained on the
project's corpus) plus an `<image>` token; the weights come from a fixed seed, so every build writes the same
bytes. A stamp file makes a second run return at once.

Two facts of this environment shape the build (measured here):
  * transformers 5 saves the CLIP tower's weights as `vision_tower.embeddings...`, while vLLM 0.32's LLaVA
    loader wants `vision_tower.vision_model.embeddings...` (it refuses the other: "no module or parameter named
    'vision_tower.embeddings'"). The checkpoint is rewritten in vLLM's layout, which transformers 5 also loads:
    its greedy output for an image then equals vLLM's (measured).
  * transformers 5's default image processors are torchvision-backed, and the PyPI torchvision wheel is a CUDA
    build that fails to import next to CPU torch. The processor config names the Pillow-backed
    `CLIPImageProcessorPil`, so neither vLLM nor transformers needs torchvision for this model (see the
    README section on vision models).

    python tools/build_tiny_llava.py [--out models/tiny-llava] [--force]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import build_tiny_model, offline_build  # noqa: E402

DEFAULT_OUT = ROOT / "models" / "tiny-llava"
IMAGE_TOKEN = "<image>"
IMAGE_SIZE, PATCH_SIZE = 56, 14
SEED = 4321

# ChatML with image parts: one <image> per image, where the client put it (vLLM's "openai" content format).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _inputs_digest() -> str:
    return offline_build.digest_of(Path(__file__), Path(build_tiny_model.__file__), build_tiny_model.CORPUS)


def _vllm_layout(name: str) -> str:
    """A saved key -> the LLaVA layout vLLM 0.32 loads: the CLIP tower's weights under `vision_model.`."""
    prefix = "vision_tower."
    if name.startswith(prefix) and not name.startswith(prefix + "vision_model."):
        return prefix + "vision_model." + name[len(prefix) :]
    return name


def build(out: Path, force: bool = False) -> Path:
    want = _inputs_digest()
    if not force and offline_build.is_built(out, want):
        return out
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import (
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = build_tiny_model.build_tokenizer(out)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)

    text_config = build_tiny_model.llama_config(tokenizer)
    vision_config = CLIPVisionConfig(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        projection_dim=64,
    )
    config = LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=image_token_id,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():
        # As in the tiny Llama: larger embeddings and output weights make greedy output depend on the input.
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 0.35)
        for parameter in model.model.multi_modal_projector.parameters():
            parameter.normal_(0.0, 1.0)
        # CLIP's default init (std 0.02) lets the position embeddings drown the pixels: every image then looks
        # alike to the language model. A larger patch embedding makes the picture itself count.
        model.model.vision_tower.embeddings.patch_embedding.weight.normal_(0.0, 0.5)
        # With the default init (std 0.02) the attention output is tiny beside a token's own embedding, so the next
        # token depends on the last prompt tokens only, never on the image tokens before them.
        for layer in model.model.language_model.layers:
            layer.self_attn.v_proj.weight.normal_(0.0, 0.15)
            layer.self_attn.o_proj.weight.normal_(0.0, 0.15)
    model.save_pretrained(out, safe_serialization=True)
    weights = out / "model.safetensors"
    save_file({_vllm_layout(k): v.contiguous() for k, v in load_file(weights).items()}, weights, {"format": "pt"})
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": text_config.bos_token_id, "eos_token_id": text_config.eos_token_id}, indent=2)
        + "\n"
    )

    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    offline_build.mark_built(out, want)
    return out


if __name__ == "__main__":
    sys.exit(offline_build.main(__doc__, DEFAULT_OUT, build, "tiny LLaVA"))
