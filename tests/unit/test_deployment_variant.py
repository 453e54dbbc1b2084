"""repo_render/variant.py: a deployment's variant for the same server (tools/bench.py --variant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repo_render import ConfigError, load_deployment, render_together
from repo_render.variant import load_variant, setting
from tools.bench import bench_repository

BENCH = Path(__file__).resolve().parents[2] / "deployments" / "examples" / "gpu-bench-1b.yaml"


def test_every_name_is_prefixed_and_each_key_set_the_rest_as_the_file_says():
    variant = load_variant(BENCH, "u_", [setting("core.engine_cpus=[]"), setting("generate.instances=12")])
    original = load_deployment(BENCH)
    assert variant.names.plain == "u_vllm_model" and variant.names.core == "u_vllm_core"
    assert {getattr(variant.names, role) for role in type(variant.names).model_fields} == {
        "u_" + getattr(original.names, role) for role in type(original.names).model_fields
    }
    assert variant.core.engine_cpus == [] and original.core.engine_cpus == [0]
    assert variant.generate.instances == 12
    assert variant.engine_args == original.engine_args and variant.entry == original.entry
    assert variant.base_dir == original.base_dir  # its model path resolves as the file's does


def test_a_missing_section_is_made_and_values_are_yaml():
    assert setting("health.restart_engine=true") == ("health.restart_engine", True)
    assert setting("core.engine_cpus=[15]") == ("core.engine_cpus", [15])
    variant = load_variant(BENCH, "v_", [setting("images.max_images=2")])
    assert variant.images.max_images == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("core.engine_cpu=[]", "core.engine_cpu: unknown key; did you mean 'engine_cpus'?"),
        ("generate.instances=many", "generate.instances"),
        ("model.path=x", "model.path: model is not a section"),
        ("names.plain=mine", "names.plain: a variant's names are the deployment's with its prefix ('w_')"),
    ],
)
def test_a_key_the_schema_refuses_fails_naming_it(text: str, message: str):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_variant(BENCH, "w_", [setting(text)])


def test_a_setting_without_a_value_is_refused():
    with pytest.raises(ConfigError, match="expected NAME=VALUE, e.g. generate.instances=12"):
        setting("core.engine_cpus")


def test_the_variant_renders_beside_its_deployment_in_one_repository(tmp_path: Path):
    variant = load_variant(BENCH, "u_", [setting("core.engine_cpus=[]")])
    files = render_together([load_deployment(BENCH), variant], tmp_path)
    models = {rel.split("/")[0] for rel in files}
    assert {"vllm_model", "vllm_core", "u_vllm_model", "u_vllm_core", "u_vllm_model_stream"} <= models


def test_bench_renders_each_variant_into_the_measured_server(tmp_path: Path):
    variants = [["p12_", "generate.instances=12"], ["u_", "core.engine_cpus=[]"]]
    setup = bench_repository(tmp_path, BENCH, {}, variants=variants)
    for model in ("vllm_model", "p12_vllm_model", "u_vllm_model", "u_vllm_model_stream"):
        assert (setup.repo / model / "config.pbtxt").is_file()
    assert setup.engine_cpus == [0]  # the bare engine is placed as --deployment's engine, not a variant's
    assert "count: 12" in (setup.repo / "p12_vllm_model" / "config.pbtxt").read_text()

    def engine_cpus(core: str) -> list[int]:
        return json.loads((setup.repo / core / "1" / "settings.json").read_text())["core"]["engine_cpus"]

    assert engine_cpus("vllm_core") == [0] and engine_cpus("u_vllm_core") == [] and engine_cpus("p12_vllm_core") == [0]


def test_bench_refuses_a_variant_the_schema_refuses(tmp_path: Path):
    with pytest.raises(SystemExit, match="--variant: core.engine_cpu: unknown key"):
        bench_repository(tmp_path, BENCH, {}, variants=[["u_", "core.engine_cpu=[]"]])
