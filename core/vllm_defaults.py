"""Defaults that vLLM owns, read from vLLM where it is importable.

The renderer reads them here and writes them into the preprocess stage's settings (`max_logprobs`,
`default_max_tokens`), so a preprocess stub never imports vLLM (seconds, and torch) for two integers. The
FALLBACK_* values are vLLM 0.26-0.32's own defaults; they are used only where vLLM is not importable: a renderer
run without vLLM, or a stage built from settings that do not carry the value.
"""

from __future__ import annotations

import dataclasses
import functools

FALLBACK_MAX_LOGPROBS = 20  # vllm.engine.arg_utils.EngineArgs.max_logprobs
FALLBACK_MAX_TOKENS = 16  # vllm.SamplingParams.max_tokens: what a request that does not set it gets


@functools.cache
def max_logprobs() -> int:
    """The engine's max_logprobs when engine_args does not set it."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return FALLBACK_MAX_LOGPROBS
    return next(f.default for f in dataclasses.fields(EngineArgs) if f.name == "max_logprobs")


@functools.cache
def max_tokens() -> int:
    """A request's max_tokens when it does not set it."""
    try:
        from vllm.sampling_params import SamplingParams
    except ImportError:
        return FALLBACK_MAX_TOKENS
    return SamplingParams().max_tokens
