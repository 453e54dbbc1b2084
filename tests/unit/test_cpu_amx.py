"""core/cpu_amx.py: the AMX request runs in every vLLM process (a general plugin) and is granted where AMX exists."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import torch

from core.cpu_amx import install


def test_registered_as_a_vllm_general_plugin():
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins.get("cpu_amx") == "core.cpu_amx:install"


def test_granted_exactly_where_the_cpu_has_amx():
    # In a fresh process: the answer must not depend on what this test process already did.
    code = "from core.cpu_amx import install; print(install())"
    granted = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert granted == str(torch.cpu._is_amx_tile_supported())
    assert install() is torch.cpu._is_amx_tile_supported()  # idempotent
