# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.
"""Triton adapter for generate (BLS over the core, one response); the logic lives in core/ and the stage packages."""

from core.triton_models import GenerateModel as TritonPythonModel  # noqa: F401
