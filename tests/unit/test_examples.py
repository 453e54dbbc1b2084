"""Every example deployment renders (what CI checks for the GPU-only ones); the CPU-runnable ones are served for
real: tiny.yaml is the session server's repository (tests/integration/test_server.py), multi-lora.yaml and
openai.yaml are served by tests/integration/test_deployments.py, vision-language.yaml by
tests/integration/test_vision.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repo_render import DEFAULT_CONFIG, ROOT, load_deployment, main, render

EXAMPLES = ROOT / "deployments" / "examples"
ALL = sorted(p.name for p in EXAMPLES.glob("*.yaml"))


def test_the_examples_are_the_ones_documented():
    assert ALL == [
        "gpu-bench-1b-postprocess-model.yaml",
        "gpu-bench-1b.yaml",
        "gpu-llama-8b-local.yaml",
        "gpu-llama-8b.yaml",
        "multi-lora.yaml",
        "openai.yaml",
        "tensor-parallel-2-local.yaml",
        "tensor-parallel-2.yaml",
        "tiny.yaml",
        "vision-language.yaml",
    ]


@pytest.mark.parametrize("name", ALL)
def test_example_renders_deterministically_and_checks_clean(tmp_path: Path, name: str):
    out = tmp_path / "repo"
    assert main([str(EXAMPLES / name), "--out", str(out)]) == 0
    assert main([str(EXAMPLES / name), "--out", str(out), "--check"]) == 0
    deployment = load_deployment(EXAMPLES / name)
    again = render(deployment, out)
    assert {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()} == again
    core = again[next(k for k in again if k.endswith("/config.pbtxt") and "KIND_MODEL" in again[k])]
    # one engine; an instance per front end of it (core.front_ends)
    assert f"count: {deployment.core.front_ends}\n  kind: KIND_MODEL" in core and "decoupled: true" in core


def _render(name: str, out: Path) -> dict[str, str]:
    return render(load_deployment(EXAMPLES / name), out)


def test_tiny_example_is_the_default_deployment():
    assert _render("tiny.yaml", ROOT / "model_repository") == render(
        load_deployment(DEFAULT_CONFIG), ROOT / "model_repository"
    )


def test_gpu_example_passes_the_hub_name_to_vllm(tmp_path: Path):
    files = _render("gpu-llama-8b.yaml", tmp_path)
    engine_args = json.loads(files["vllm_core/1/model.json"])
    assert engine_args["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert engine_args["gpu_memory_utilization"] == 0.9
    assert json.loads(files["preprocess/1/stage.json"])["settings"]["tokenizer"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_tensor_parallel_example_runs_one_kind_model_engine_over_two_gpus(tmp_path: Path):
    files = _render("tensor-parallel-2.yaml", tmp_path)
    assert json.loads(files["vllm_core/1/model.json"])["tensor_parallel_size"] == 2
    assert "instance_group {\n  count: 1\n  kind: KIND_MODEL\n}" in files["vllm_core/config.pbtxt"]


def test_local_tensor_parallel_example_differs_from_its_single_gpu_sibling_only_in_tp(tmp_path: Path):
    one = json.loads(_render("gpu-llama-8b-local.yaml", tmp_path / "one")["vllm_core/1/model.json"])
    two = json.loads(_render("tensor-parallel-2-local.yaml", tmp_path / "two")["vllm_core/1/model.json"])
    assert two.pop("tensor_parallel_size") == 2 and two.pop("distributed_executor_backend") == "mp"
    assert one == two


def test_the_postprocess_model_bench_variant_differs_only_by_its_names_and_postprocess_in_sender():
    """What `tools/bench.py --also-deployment` measures beside gpu-bench-1b.yaml in one server: the same deployment
    but with the postprocess stage as its own model (core.postprocess_in_sender false), under model names of its
    own."""
    base = load_deployment(EXAMPLES / "gpu-bench-1b.yaml").model_dump()
    dump = load_deployment(EXAMPLES / "gpu-bench-1b-postprocess-model.yaml").model_dump()
    assert set(dump.pop("names").values()).isdisjoint(base.pop("names").values())
    assert dump["core"].pop("postprocess_in_sender") is False and base["core"].pop("postprocess_in_sender") is True
    assert dump == base


def test_multi_lora_example_lists_its_adapters_for_the_core_and_preprocess(tmp_path: Path):
    files = _render("multi-lora.yaml", ROOT / "model_repository")
    loras = json.loads(files["vllm_core/1/multi_lora.json"])
    assert loras == {"tiny-lora": "../models/tiny-llama-lora", "tiny-lora-copy": "../models/tiny-llama-lora"}
    assert json.loads(files["preprocess/1/stage.json"])["settings"]["lora_names"] == ["tiny-lora", "tiny-lora-copy"]
    assert {"lora_model/config.pbtxt", "lora_model_stream/config.pbtxt"} <= set(files)


def test_vision_language_example_passes_image_limits_to_preprocess(tmp_path: Path):
    files = _render("vision-language.yaml", tmp_path)
    settings = json.loads(files["preprocess/1/stage.json"])["settings"]
    assert (settings["max_image_bytes"], settings["max_image_pixels"], settings["max_images"]) == (4194304, 1048576, 2)
    assert settings["allow_request_chat_template"] is False
    assert settings["image_placeholder"] == "<image>"
    engine_args = json.loads(files["vllm_core/1/model.json"])
    assert engine_args["limit_mm_per_prompt"] == {"image": 2}
    # tests/integration/test_vision.py compares its answers exactly with vLLM offline
    assert engine_args["dtype"] == "float32"


def test_openai_example_outputs_one_chat_completion_tensor(tmp_path: Path):
    files = _render("openai.yaml", tmp_path)
    for ensemble in ("chat_model", "chat_model_stream"):
        config = files[f"{ensemble}/config.pbtxt"]
        assert 'output {\n  name: "chat_completion"\n  data_type: TYPE_STRING\n  dims: 1\n}' in config
    stage = json.loads(files["postprocess/1/stage.json"])
    assert stage["class"] == "postprocess.openai:OpenAIPostprocessor"
    # the engine's tokenizer too: every postprocess stage decodes the engine's token ids
    assert stage["settings"]["model_name"] == "chat_model"
    assert stage["settings"]["tokenizer"].endswith("models/tiny-llama")
