"""The files the README and docs/ name exist: a renamed deployment or a moved results file must not leave the docs
pointing at nothing. A path counts when it starts at one of the project's top-level folders and names a file (its
last part has an extension) or a folder (it ends with "/"); brace and glob patterns are expanded. A path after a
colon (`git show COMMIT:path`) names a file of another commit and is not checked."""

from __future__ import annotations

import glob
import itertools
import re

from repo_render import ROOT

# models/ is not here: its checkpoints are built by the tools, not committed
TOP = "docs|deployments|tools|tests|core|preprocess|postprocess|repo_render|model_repository"
PATH = re.compile(rf"(?<![\w:/.$-])((?:{TOP})/[\w{{}},.*/-]+)")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _expanded(pattern: str) -> list[str]:
    parts = re.split(r"(\{[^}]*\})", pattern)
    return ["".join(c) for c in itertools.product(*[p[1:-1].split(",") if p[:1] == "{" else [p] for p in parts])]


def named_paths(text: str) -> list[str]:
    """The file and folder paths a document names (see the module's docstring)."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".,")
        if path.endswith("/") or "." in path.rsplit("/", 1)[-1]:
            found.extend(_expanded(path))
    return found


def test_the_path_finder_sees_files_folders_and_patterns_and_skips_other_commits():
    text = (
        "see `docs/a.md`, docs/gpu-bench-ab/x-{1,2}.json.xz and tools/corpus/ but not core/generate"
        " nor `git show abc1234:docs/old.png`"
    )
    expected = ["docs/a.md", "docs/gpu-bench-ab/x-1.json.xz", "docs/gpu-bench-ab/x-2.json.xz", "tools/corpus/"]
    assert named_paths(text) == expected


def test_every_path_the_docs_name_exists():
    missing = [
        f"{doc.relative_to(ROOT)}: {path}"
        for doc in DOCS
        for path in named_paths(doc.read_text(encoding="utf-8"))
        if not glob.glob(str(ROOT / path))
    ]
    assert not missing, "\n".join(missing)
