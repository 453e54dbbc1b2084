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

import argparse
import sys
from pathlib import Path

from repo_render.checks import load_deployment
from repo_render.repository import drift, render, write
from repo_render.schema import DEFAULT_CONFIG, DEFAULT_OUT, ConfigError
from repo_render.substitute import set_argument


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=set_argument,
        metavar="NAME=VALUE",
        help="the value of ${NAME} in the config",
    )
    parser.add_argument(
        "--relative-model-paths",
        action="store_true",
        help="write local paths outside the output's project (model, adapters, chat template) relative to the"
        " output too; by default they are absolute, so the rendered repository can move",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if --out differs from the rendering")
    mode.add_argument("--dry-run", action="store_true", help="list the files that would be written")
    args = parser.parse_args(argv)
    variables = dict(args.set)
    try:
        files = render(load_deployment(args.config, variables), args.out, args.relative_model_paths)
    except ConfigError as exc:
        print(f"render_repo: {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for rel in files:
            print(args.out / rel)
        return 0
    if args.check:
        problems = drift(files, args.out)
        for line in problems:
            print(f"render_repo: {line}", file=sys.stderr)
        return 1 if problems else 0
    write(files, args.out)
    print(f"render_repo: wrote {len(files)} files to {args.out}")
    return 0
