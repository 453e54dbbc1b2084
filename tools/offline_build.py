"""What the offline builders of the project's models share: a stamp that skips an unchanged build, and the CLI."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable
from pathlib import Path

STAMP_NAME = ".build-stamp"


def digest_of(*files: Path) -> str:
    """The stamp's value: a build is reused only while its builder's inputs (these files) are unchanged."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def is_built(out: Path, digest: str) -> bool:
    stamp = out / STAMP_NAME
    return stamp.exists() and stamp.read_text().strip() == digest


def mark_built(out: Path, digest: str) -> None:
    (out / STAMP_NAME).write_text(digest + "\n")


def main(doc: str, default_out: Path, build: Callable[..., Path], what: str, argv: list[str] | None = None) -> int:
    """`--out DIR [--force]` for a builder `build(out, force=...)`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args(argv)
    out = build(args.out.resolve(), force=args.force)
    print(f"{what} ready in {out}")
    return 0
