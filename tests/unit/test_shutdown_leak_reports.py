"""The launcher's reading of Triton's shutdown reports: a leak is only the same ensemble-only report, repeated."""

from __future__ import annotations

from pathlib import Path

from tools.triton_server import TritonServer

ENSEMBLE_CONFIG = 'name: "{name}"\nplatform: "ensemble"\n'


def _report(counts: dict[str, int], timeout: int) -> str:
    lines = [
        f'I1124 server.cc:321] "Timeout {timeout}: Found {len(counts)} model versions that have in-flight inferences"'
    ]
    lines += [
        f"I1124 server.cc:325] \"Model '{m}' (version 1) has {n} in-flight inferences\"" for m, n in counts.items()
    ]
    return "\n".join(lines) + "\n"


def _server(tmp_path: Path, reports: list[dict[str, int]]) -> TritonServer:
    repository = tmp_path / "repository"
    for name in ("plain", "stream"):
        (repository / name).mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(name=name))
    (repository / "core").mkdir()
    (repository / "core" / "config.pbtxt").write_text('name: "core"\nbackend: "python"\n')
    log = tmp_path / "tritonserver.log"
    log.write_text("Signal (2) received.\n" + "".join(_report(r, 10 - i) for i, r in enumerate(reports)))
    return TritonServer(repository, log_file=log)


def test_a_report_repeated_with_only_ensembles_is_a_leak(tmp_path):
    stuck = {"stream": 4}
    # the last report may still be being written: LEAK_REPORTS complete ones are needed before it
    reports = [stuck] * (TritonServer.LEAK_REPORTS + 1)
    assert _server(tmp_path, reports)._only_ensembles_in_flight() == stuck
    assert _server(tmp_path / "fewer", reports[:-1])._only_ensembles_in_flight() == {}


def test_ensemble_requests_that_end_within_a_few_reports_are_not_a_leak(tmp_path):
    # measured on Triton 2.51: cancelled plain-ensemble requests stayed in the count for two reports, then ended
    both, streams = {"plain": 2, "stream": 4}, {"stream": 4}
    assert _server(tmp_path, [both, both, streams])._only_ensembles_in_flight() == {}
    longer = [both] * (TritonServer.LEAK_REPORTS - 1) + [streams] * 2
    assert _server(tmp_path / "longer", longer)._only_ensembles_in_flight() == {}
    settled = [both, both] + [streams] * (TritonServer.LEAK_REPORTS + 1)
    assert _server(tmp_path / "settled", settled)._only_ensembles_in_flight() == streams


def test_a_composing_model_in_flight_is_never_a_leak(tmp_path):
    reports = [{"stream": 4, "core": 1}] * (TritonServer.LEAK_REPORTS + 2)
    assert _server(tmp_path, reports)._only_ensembles_in_flight() == {}
