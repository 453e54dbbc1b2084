"""Let vLLM's LLaVA code import on a CPU machine without torchvision.

vLLM 0.32's `llava.py` imports `pixtral.py`, which takes one helper, `_num_image_tokens`, from transformers 5's
torchvision-backed `image_processing_pixtral` module; that module imports torchvision at the top. The only
torchvision on PyPI for torch 2.13 is a CUDA build that fails to import next to CPU torch ("operator
torchvision::nms does not exist"), and a CPU build is not on PyPI. transformers ships a Pillow-backed twin,
`image_processing_pil_pixtral`, with the same helpers (identical code), and with torchvision absent transformers
itself already picks the Pillow image processors.

So, only when torchvision is NOT installed, an import hook serves the torchvision module's name with its Pillow
twin. Nothing is patched on disk and nothing changes where torchvision is installed (GPU machines).

vLLM imports the model class in child processes too (the EngineCore process, a `python -m
vllm.model_executor.models.registry` subprocess that inspects it). Those children cannot be reached through the
environment (the Triton stub's embedded Python passes -E/-I flags to its children, so PYTHONPATH or
sitecustomize do not work), but vLLM loads its "general plugins" in every one of them: `install` is registered
as one (pyproject.toml, entry point group `vllm.general_plugins`), and the core also calls it directly.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

TORCHVISION_MODULE = "transformers.models.pixtral.image_processing_pixtral"
PILLOW_TWIN = "transformers.models.pixtral.image_processing_pil_pixtral"


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
    """Install the hook in this process (idempotent); True if torchvision is absent and the hook is active."""
    if torchvision_available():
        return False
    if not any(isinstance(finder, _TwinFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TwinFinder())
    return True
