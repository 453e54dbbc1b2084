"""Every engine of the core is configured with vLLM's server usage context (core/engine_config.py): the settings the
engine args leave out get `vllm serve`'s defaults, not AsyncLLM's ENGINE_CONTEXT ones. On a CPU both contexts give
the same numbers, so vLLM's table of defaults is replaced here by one whose contexts differ; vLLM's own config
code does the rest (no engine starts: AsyncLLM's constructor is replaced by one that keeps the config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm.engine.arg_utils import EngineArgs
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM

from core import front_ends
from core.engine import start_own_engine

SERVER = {"max_num_batched_tokens": 1536, "max_num_seqs": 48}
OTHERS = {"max_num_batched_tokens": 4096, "max_num_seqs": 96}  # vLLM's offline LLM class's


@pytest.fixture
def contexts_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    def batch_defaults(cls: Any, world_size: int) -> tuple[dict, dict]:
        tokens = {UsageContext.OPENAI_API_SERVER: SERVER["max_num_batched_tokens"]}
        seqs = {UsageContext.OPENAI_API_SERVER: SERVER["max_num_seqs"]}
        tokens[UsageContext.LLM_CLASS], seqs[UsageContext.LLM_CLASS] = OTHERS.values()
        return tokens, seqs

    monkeypatch.setattr(EngineArgs, "get_batch_defaults", classmethod(batch_defaults))


def _scheduler(config: Any) -> dict[str, int]:
    return {key: getattr(config.scheduler_config, key) for key in SERVER}


def test_the_shared_engine_of_several_front_ends_gets_the_server_defaults(tiny_model: Path, contexts_differ):
    config, _ = front_ends.vllm_config({"model": str(tiny_model), "max_model_len": 256})
    assert _scheduler(config) == SERVER
    # what the engine args set wins
    config, _ = front_ends.vllm_config({"model": str(tiny_model), "max_model_len": 256, "max_num_seqs": 7})
    assert _scheduler(config) == {**SERVER, "max_num_seqs": 7}


def test_an_engine_of_its_own_gets_the_server_defaults(
    tiny_model: Path, contexts_differ, monkeypatch: pytest.MonkeyPatch
):
    built: dict[str, Any] = {}

    def keep_config(self: AsyncLLM, vllm_config: Any, executor_class: Any, **kwargs: Any) -> None:
        built.update(config=vllm_config, usage_context=kwargs["usage_context"], stat_loggers=kwargs["stat_loggers"])

    monkeypatch.setattr(AsyncLLM, "__init__", keep_config)
    monkeypatch.setattr(AsyncLLM, "__del__", lambda self: None)
    loggers = [object()]
    start_own_engine({"model": str(tiny_model), "max_model_len": 256}, loggers)
    assert _scheduler(built["config"]) == SERVER
    assert built["usage_context"] == UsageContext.OPENAI_API_SERVER and built["stat_loggers"] == loggers
