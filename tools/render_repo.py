"""Render a whole Triton model repository from one deployment config.

    python tools/render_repo.py [CONFIG] [--out DIR] [--check] [--dry-run] [--set NAME=VALUE ...]
                                [--relative-model-paths]

CONFIG defaults to deployments/default.yaml and --out to model_repository/. The same config always gives the
same bytes. Nothing is written unless the whole config is valid (exit 2 with a message naming the key path and
the fix): keys and types, placeholders, engine args against vLLM's AsyncEngineArgs, model names, and the stages'
declared tensors against their neighbours and Triton's ensemble rules. --check compares with the existing tree
and exits 1 on any difference; --dry-run lists the files that would be written; --set fills ${NAME}.
Local paths (model, LoRA adapters, chat template file) inside the output's project (the nearest folder above it
with .git) are written relative to the output; any other is written absolute unless --relative-model-paths."""

from __future__ import annotations

import sys

from repo_render.cli import main

if __name__ == "__main__":
    sys.exit(main())
