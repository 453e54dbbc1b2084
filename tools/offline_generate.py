"""vLLM's own offline output (`vllm.LLM.generate`, or `vllm.LLM.chat` with --chat) with a model.json's engine args.

The tests compare what the Triton ensembles return with this, computed in a separate process.

    python tools/offline_generate.py MODEL_JSON PROMPTS_JSON OUT_JSON [--max-tokens N] [--chat]

PROMPTS_JSON is a JSON list of prompts (a string, or `{"prompt": str, "images": [base64, ...]}` for a
vision-language model), or with --chat a list of chat cases
`{"messages": [...], "options": {...}}` (options: `LLM.chat` keyword arguments such as `chat_template`,
`chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`, `tools`; `documents` is passed in
`chat_template_kwargs`, which is how vLLM hands it to the template). Each case is run on its own (one `LLM.chat`
call per option set). OUT_JSON gets a list of {"text", "token_ids", "prompt_token_ids"} (greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _result(output) -> dict:
    return {
        "text": output.outputs[0].text,
        "token_ids": list(output.outputs[0].token_ids),
        "prompt_token_ids": list(output.prompt_token_ids or ()),
    }


def _prompt(item: str | dict) -> str | dict:
    if isinstance(item, str):
        return item
    import base64
    import io

    from PIL import Image

    images = [Image.open(io.BytesIO(base64.b64decode(b))).convert("RGB") for b in item.get("images", [])]
    return {"prompt": item["prompt"], "multi_modal_data": {"image": images}} if images else item["prompt"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_json", type=Path)
    parser.add_argument("prompts_json", type=Path)
    parser.add_argument("out_json", type=Path)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chat", action="store_true", help="PROMPTS_JSON holds chat cases: run LLM.chat")
    args = parser.parse_args(argv)

    from core.engine import prepare_process_environment
    from core.engine_config import load_engine_args

    prepare_process_environment()  # the same process set-up as the server's core (locale, torchvision hook)
    engine_args = load_engine_args(args.model_json)
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    prompts = json.loads(args.prompts_json.read_text())
    if args.chat:
        result = []
        for case in prompts:
            options = dict(case.get("options", {}))
            if "documents" in options:
                options.setdefault("chat_template_kwargs", {})["documents"] = options.pop("documents")
            (output,) = llm.chat(case["messages"], greedy, use_tqdm=False, **options)
            result.append(_result(output))
    else:
        result = [_result(o) for o in llm.generate([_prompt(p) for p in prompts], greedy, use_tqdm=False)]
    args.out_json.write_text(json.dumps(result, ensure_ascii=False, indent=1))
    return 0


def main_in_private_tmp(argv: list[str] | None = None) -> int:
    """main() with a TMPDIR of its own, removed at the end (tools/triton_server.py's private_tmp_dir)."""
    from tools.triton_server import private_tmp_dir

    with private_tmp_dir("vllm-offline-"):
        return main(argv)


if __name__ == "__main__":
    sys.exit(main_in_private_tmp())
