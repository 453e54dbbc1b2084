"""The packages' layering, read from the source with `ast` (nothing is imported): core/ is below the stage
packages, and the stages never reach into the engine or the Triton adapters.

The Triton adapters (core/adapters/, named by core/triton_models.py) are the one exception on the core side: they
load the stage classes, but by import path at run time (core/stage.py's load_stage_class), so even they have no
static import of a stage package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGE_PACKAGES = ("preprocess", "postprocess")
ENGINE_SIDE = ("core.engine", "core.triton_models", "core.adapters")


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module a file below `root` imports, at any depth (function-level imports too), as dotted names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                package = path.relative_to(root).parent.parts
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            # `from core import engine` imports core.engine
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    return files


def test_the_parser_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks below are only as good as this: plain, from, nested and relative imports are all found."""
    package = tmp_path / "core"
    package.mkdir()
    source = package / "sample.py"
    source.write_text(
        "import postprocess.detokenize\n"
        "from preprocess import sampling\n"
        "def f():\n"
        "    from core.engine import Engine\n"
        "from . import protocol\n"
    )
    found = imported_modules(source, root=tmp_path)
    assert {"postprocess.detokenize", "preprocess.sampling", "core.engine", "core.protocol"} <= found


@pytest.mark.parametrize("path", _sources("core"), ids=lambda p: p.name)
def test_core_never_imports_a_stage_package(path: Path) -> None:
    stage_imports = sorted(m for m in imported_modules(path) if _within(m, STAGE_PACKAGES))
    assert not stage_imports, f"{path.relative_to(ROOT)} imports {stage_imports}: core/ must stay below the stages"


@pytest.mark.parametrize(
    "path", [p for package in STAGE_PACKAGES for p in _sources(package)], ids=lambda p: f"{p.parent.name}/{p.name}"
)
def test_stages_never_import_the_engine_or_the_triton_adapters(path: Path) -> None:
    engine_imports = sorted(m for m in imported_modules(path) if _within(m, ENGINE_SIDE))
    assert not engine_imports, f"{path.relative_to(ROOT)} imports {engine_imports}: stages see only the contract"
