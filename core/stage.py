"""The stage interface: what a preprocess or postprocess implementation provides (pure Python, no Triton).

A stage is a class with:
  * `inputs` / `outputs`: the TensorSpecs it consumes and produces (the renderer writes its config.pbtxt
    from them and checks them against its neighbours in the ensembles);
  * `__init__(settings)`: settings from the deployment config (a JSON-able mapping);
  * `process(inputs, parameters)`: numpy arrays by tensor name (only the tensors the request carries) and
    the request's parameters -> numpy arrays by output name. Raise `InvalidInput` for a bad request.

Deployments may point a stage at their own class (`package.module:Class`) that follows this interface, from an
installed package or from a folder of their own (the deployment's `code_paths`).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from core.interface import InvalidInput, TensorSpec


class Stage:
    inputs: ClassVar[tuple[TensorSpec, ...]] = ()
    outputs: ClassVar[tuple[TensorSpec, ...]] = ()

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)

    def process(self, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError


def load_stage_class(path: str, code_paths: Sequence[str] = ()) -> type[Stage]:
    """Import `package.module:Class`; the error says what is wrong with the path.

    `code_paths`: folders to import the deployment's own code from, put first on sys.path (and left there: the
    class may import more of its code later). Triton's Python stubs do not read PYTHONPATH, so this is how a stage
    from a folder outside the installed packages is found.
    """
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"stage class {path!r} must look like 'package.module:ClassName'")
    for folder in reversed(code_paths):
        if not Path(folder).is_dir():
            raise ValueError(f"stage class {path!r}: its code folder {folder} does not exist")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"stage class {path!r}: cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"stage class {path!r}: module {module_name!r} has no attribute {class_name!r}")
    if not isinstance(cls, type) or not callable(getattr(cls, "process", None)):
        raise ValueError(f"stage class {path!r} is not a class with a process() method")
    return cls


# Reading request tensors. One place for the rules (shape, dtype, boolean strings), shared by every stage.

_TRUE_STRINGS = frozenset({"true", "1", "yes", "on"})
_FALSE_STRINGS = frozenset({"false", "0", "no", "off"})


def parse_bool(value: Any, field: str) -> bool:
    """A boolean given as a bool, a 0/1 number or a string such as "true" / "False"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return bool(value)
    if isinstance(value, (bytes, np.bytes_)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE_STRINGS:
            return True
        if lowered in _FALSE_STRINGS:
            return False
    raise InvalidInput(f"{field}: expected a boolean, got {value!r}")


def _invalid_json(field: str, exc: json.JSONDecodeError) -> InvalidInput:
    return InvalidInput(f"{field}: invalid JSON ({exc.msg} at position {exc.pos})")


def parse_json_container(value: Any, field: str, *, keep_invalid: bool = False) -> Any:
    """Request parameters are scalars: lists and objects arrive JSON-encoded in a string. A string that looks
    like one but does not parse is an error, or stays a string with `keep_invalid` (a stop string may be "[x")."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            if keep_invalid:
                return value
            raise _invalid_json(field, exc) from None
    return value


def parse_json_object(text: str, field: str) -> dict[str, Any]:
    """A tensor that holds one JSON object (`sampling_parameters`, `chat_options`); blank text is {}."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise _invalid_json(field, exc) from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{field}: expected a JSON object, got {type(doc).__name__}")
    return doc


def scalar(inputs: Mapping[str, np.ndarray], name: str) -> Any | None:
    """The single element of a [1]-shaped input, or None when the request does not carry it."""
    array = inputs.get(name)
    if array is None:
        return None
    if array.size != 1:
        raise InvalidInput(f"{name}: expected exactly one element, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def string_scalar(inputs: Mapping[str, np.ndarray], name: str) -> str | None:
    value = scalar(inputs, name)
    if value is None:
        return None
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{name}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if isinstance(value, str):
        return value
    raise InvalidInput(f"{name}: expected a string, got {type(value).__name__}")


def bool_scalar(inputs: Mapping[str, np.ndarray], name: str, default: bool) -> bool:
    value = scalar(inputs, name)
    return default if value is None else parse_bool(value, name)
