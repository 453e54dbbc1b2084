"""Reading `vllm_core/1/model.json`: vLLM `AsyncEngineArgs` keys, as in the Triton vLLM backend's model.json; and the
usage context vLLM's config is built with from them.

Paths: a value of `model` or `tokenizer` that starts with "./" or "../" is relative to the model repository's
root (so a rendered repository is the same on every machine); anything else (an absolute path, a hub name) is
passed to vLLM as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENGINE_ARGS_FILE = "model.json"
PATH_KEYS = ("model", "tokenizer")


def resolve_path(value: str, repository_root: Path) -> str:
    """A rendered path: "./" or "../" starts at the repository root; anything else stays as it is."""
    if value.startswith("./") or value.startswith("../"):
        return str((repository_root / value).resolve())
    return value


def resolve_paths(
    engine_args: dict[str, Any], repository_root: Path, keys: tuple[str, ...] = PATH_KEYS
) -> dict[str, Any]:
    resolved = dict(engine_args)
    for key in keys:
        value = resolved.get(key)
        if isinstance(value, str):
            resolved[key] = resolve_path(value, repository_root)
    return resolved


def load_engine_args(model_json: Path) -> dict[str, Any]:
    """model.json of `<repo>/<model>/<version>/model.json`, with its relative paths resolved."""
    model_json = Path(model_json).resolve()
    args = json.loads(model_json.read_text())
    if not isinstance(args, dict):
        raise ValueError(f"{model_json}: expected a JSON object of vLLM engine arguments")
    return resolve_paths(args, model_json.parent.parent.parent)


def serving_usage_context() -> Any:
    """The usage context every engine of the core is configured with: that of vLLM's own servers (`vllm serve`,
    vLLM's gRPC server; the Triton vLLM backend's too), not AsyncLLM's default ENGINE_CONTEXT. By it vLLM picks the
    defaults of `max_num_batched_tokens` and `max_num_seqs` where the engine args leave them out: on an H100 or H200
    8192 and 1024 for a server against 2048 and 128, so a deployment that does not set them serves as many requests
    at once as `vllm serve` would (on a CPU both contexts give 2048 and 128)."""
    from vllm.usage.usage_lib import UsageContext

    return UsageContext.OPENAI_API_SERVER
