# Rendered by tools/render_repo.py from a deployment config. Do not edit: change the config and re-render.
"""Triton adapter for the postprocess stage; the logic lives in core/ and the stage packages."""

from core.triton_models import StageModel as TritonPythonModel  # noqa: F401
