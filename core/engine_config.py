"""Reading `vllm_core/1/model.json`: vLLM `AsyncEngineArgs` keys, as in the Triton vLLM backend's model.json.

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
