"""The Triton Python-backend adapters, by the names the rendered `model_repository/*/1/model.py` files import.

Each lives in core/adapters/, one module per model kind; the logic is in core/ and the stage packages.
"""

from core.adapters.core_model import CoreModel
from core.adapters.entry_model import EntryModel
from core.adapters.generate_model import GenerateModel
from core.adapters.stage_model import StageModel

__all__ = ["CoreModel", "EntryModel", "GenerateModel", "StageModel"]
