"""tools/check_deployment.py against a real server: every way in answers, and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repo_render import ROOT
from tools.check_deployment import main

pytestmark = pytest.mark.server


def test_every_way_in_answers_the_tiny_deployment(tmp_path: Path, tiny_model: Path):
    report_file = tmp_path / "report.json"
    code = main(
        [str(ROOT / "deployments" / "examples" / "tiny.yaml"), "--report", str(report_file), "--max-tokens", "8"]
    )
    report = json.loads(report_file.read_text())
    assert code == 0 and report["ok"], report
    assert len(report["answers"]) == 7
    for name, answer in report["answers"].items():
        assert answer["finish_reason"] == "length", name
        assert answer["output_tokens"] == 8, name  # streams: the deltas add up to the whole
    assert report["answers"]["grpc stream"]["responses"] >= 2
    assert report["load_seconds"] > 0
    assert report["gpu_memory_mib"]["loaded"] is None or all(m > 0 for m in report["gpu_memory_mib"]["loaded"])


def test_a_broken_deployment_is_refused_before_serving(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\nengine_args: {max_model_len: ten}\n")
    assert main([str(bad)]) == 2
    assert "max_model_len" in capsys.readouterr().err
