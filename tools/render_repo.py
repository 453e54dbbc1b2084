"""Render a whole Triton model repository from one deployment config: `python tools/render_repo.py --help`.

The renderer is the package repo_render/ (its usage text is in repo_render/cli.py); this is its command line."""

from __future__ import annotations

import sys

from repo_render.cli import main

if __name__ == "__main__":
    sys.exit(main())
