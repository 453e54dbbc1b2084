"""Let vLLM's LLaVA code import on a CPU machine without torchvision.

vLLM 0.32's `llava.py` imports `pixtral.py`, which takes one helper, `_num_image_tokens`, from transformers 5's
torchvision-backed `image_processing_pixtral` module; that module imports torchvision at the top. The only
torchvision on PyPI for torch 2.13 is a CUDA build that fails to import next to CPU torch ("operator
torchvision::nms does not exist"), and a CPU build is not on PyPI. transformers ships a Pillow-backed twin,
`image_processing_pil_pixtral`, with the same helpers (identical code), and with torchvision absent transformers
itself already picks the Pillow image processors.

So, only when torchvision is NOT installed, an import hook serves the torchvision module's name with its Pillow
twin. Nothing is patched on disk and nothing changes where torchvision is installed (GPU machines).

vLLM imports the model class in child processes too (a `python -m vllm.model_executor.models.registry`
subprocess inspects it; the engine core may be spawned). `install()` therefore also puts `site_hooks/`, whose
`sitecustomize.py` calls `install()`, on the children's PYTHONPATH.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TORCHVISION_MODULE = "transformers.models.pixtral.image_processing_pixtral"
PILLOW_TWIN = "transformers.models.pixtral.image_processing_pil_pixtral"
SITE_HOOKS = Path(__file__).resolve().parent / "site_hooks"
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class _TwinLoader(importlib.abc.Loader):
    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(PILLOW_TWIN)

    def exec_module(self, module: ModuleType) -> None:
        return None  # the twin is already executed


class _TwinFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != TORCHVISION_MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _TwinLoader())


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def install() -> bool:
    """Install the hook in this process and its children; True if torchvision is absent (hook active)."""
    if torchvision_available():
        return False
    if not any(isinstance(finder, _TwinFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TwinFinder())
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    wanted = [p for p in (str(SITE_HOOKS), str(PROJECT_ROOT)) if p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join([*wanted, *(p for p in paths if p)])
    return True
