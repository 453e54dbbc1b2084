"""tools/trace_timeline.py's reading of Triton's trace file (its format as tritonserver 2.51 writes it)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.trace_timeline import event_offsets, load_trace, loaded_level_table, timeline


def _records(request: int, origin_ns: int) -> list[dict]:
    ensemble, pre, post1, post2 = (request * 10 + k for k in range(4))
    records = [{"id": ensemble, "model_name": "ens", "model_version": 1}]
    records += [{"id": pre, "model_name": "preprocess", "parent_id": ensemble}]
    records += [{"id": post1, "model_name": "postprocess", "parent_id": ensemble}]
    records += [{"id": post2, "model_name": "postprocess", "parent_id": ensemble}]
    stamps = [
        (ensemble, "REQUEST_START", 0),
        (pre, "COMPUTE_START", 1_000_000),
        (post1, "REQUEST_START", 5_000_000 + request * 1_000_000),
        (post2, "REQUEST_START", 9_000_000),
    ]
    records += [{"id": i, "timestamps": [{"name": n, "ns": origin_ns + ns}]} for i, n, ns in stamps]
    return records


def test_steps_are_timed_from_the_ensembles_start_with_the_first_execution_of_each_model(tmp_path: Path):
    trace = tmp_path / "trace.json"
    records = _records(1, 10**12) + _records(2, 2 * 10**12) + _records(3, 3 * 10**12)
    trace.write_text(json.dumps(records)[:-1] + ",")  # tritonserver still running: the array is not closed
    count, medians = timeline(load_trace(trace), "ens")
    assert count == 3
    assert medians == {"ens REQUEST_START": 0.0, "preprocess COMPUTE_START": 1.0, "postprocess REQUEST_START": 7.0}


def test_a_loaded_levels_table_orders_events_by_their_mean_with_the_mean_gap_from_the_one_before(tmp_path: Path):
    trace = tmp_path / "trace.json"
    records = _records(1, 10**12) + _records(2, 2 * 10**12) + _records(3, 3 * 10**12)
    trace.write_text(json.dumps(records))
    count, offsets = event_offsets(load_trace(trace), "ens")
    assert count == 3
    table = loaded_level_table(offsets)
    assert [row[0] for row in table] == ["ens REQUEST_START", "preprocess COMPUTE_START", "postprocess REQUEST_START"]
    event, mean, p50, p90, gap = table[2]  # the first postprocess: 6, 7 and 8 ms after the start
    assert (mean, p50, p90, gap) == (7.0, 7.0, 8.0, 6.0)
