"""`${NAME}` placeholders in a raw deployment config, filled from `--set NAME=VALUE`."""

from __future__ import annotations

import argparse
import re
from typing import Any

import yaml

from repo_render.schema import ConfigError

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def set_argument(text: str) -> tuple[str, str]:
    """argparse `type=` of every command's `--set NAME=VALUE` (`dict()` of the list is the variables)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


def substitute(doc: Any, variables: dict[str, str], where: str = "") -> Any:
    """Replace `${NAME}` in every string of the raw config by `variables[NAME]` (from `--set NAME=VALUE`).

    A value that is exactly one placeholder takes the YAML type of its replacement (`--set N=2` gives an int).
    Any placeholder left over is an error that names the key: unlike `string.Template.safe_substitute`, nothing
    unresolved ever reaches a written file.
    """
    if isinstance(doc, dict):
        return {k: substitute(v, variables, f"{where}.{k}" if where else str(k)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [substitute(v, variables, f"{where}[{i}]") for i, v in enumerate(doc)]
    if not isinstance(doc, str) or "${" not in doc:
        return doc
    whole = _PLACEHOLDER.fullmatch(doc)
    if whole and whole.group(1) in variables:
        return yaml.safe_load(variables[whole.group(1)])
    text = _PLACEHOLDER.sub(lambda m: variables.get(m.group(1), m.group(0)), doc)
    if "${" in text:
        left = _PLACEHOLDER.search(text)
        name = left.group(1) if left else "NAME"
        raise ConfigError(
            f"{where or 'config'}: unresolved placeholder in {doc!r}; pass --set {name}=VALUE or write the value"
        )
    return text
