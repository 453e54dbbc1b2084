"""vLLM's own offline output (`vllm.LLM.generate`) for a list of prompts, with a model.json's engine args.

The tests compare what the Triton ensembles return with this, computed in a separate process.

    python tools/offline_generate.py MODEL_JSON PROMPTS_JSON OUT_JSON [--max-tokens N]

PROMPTS_JSON is a JSON list of strings; OUT_JSON gets a list of {"text", "token_ids"} (greedy decoding).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_json", type=Path)
    parser.add_argument("prompts_json", type=Path)
    parser.add_argument("out_json", type=Path)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)

    from core.engine_config import load_engine_args

    engine_args = load_engine_args(args.model_json)
    from vllm import LLM, SamplingParams

    llm = LLM(**engine_args)
    prompts = json.loads(args.prompts_json.read_text())
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    result = [{"text": o.outputs[0].text, "token_ids": list(o.outputs[0].token_ids)} for o in outputs]
    args.out_json.write_text(json.dumps(result, ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
