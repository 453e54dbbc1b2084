"""Python-backend facts the core's design and the launcher rest on (docs/platform-notes.md T9, T10, T11), shown on the
real tritonserver with trivial Python models (no vLLM)."""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as http

from tools.triton_server import (
    ModelLoadError,
    exit_timeout_for,
    python_backend_threads,
    python_instance_counts,
    start_on_free_ports,
)

pytestmark = pytest.mark.server

# execute holds its requests for 50 ms, so requests sent together queue behind it; it answers each with how many
# requests that execute had.
MODEL_PY = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)
        size = np.array([str(len(requests)).encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", size)]) for _ in requests]
"""
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input {{ name: "x" data_type: TYPE_STRING dims: [1] }}
output {{ name: "y" data_type: TYPE_STRING dims: [1] }}
instance_group {{ count: {count} kind: KIND_CPU }}
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
"""
MODELS = {"unbatched": (0, 1), "batched": (8, 3)}  # name -> (max_batch_size, instances)
# The launcher sizes thread-pool-size by the repository's BLS worker threads (generate.max_in_flight in a rendered
# repository's settings.json): one model here says 256, which the models themselves never read.
POOL = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repository = tmp_path_factory.mktemp("repo")
    for name, (max_batch_size, count) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.py").write_text(MODEL_PY)
        config = CONFIG.format(name=name, max_batch_size=max_batch_size, count=count)
        (repository / name / "config.pbtxt").write_text(config)
    (repository / "batched" / "1" / "settings.json").write_text(json.dumps({"max_in_flight": POOL}))
    assert python_backend_threads(repository) == POOL
    server = start_on_free_ports(repository, repository / "tritonserver.log", timeout=120)
    yield server
    server.stop()


def _execute_sizes(server, model: str, requests: int, batched: bool) -> list[int]:
    def one(_: int) -> int:
        client = http.InferenceServerClient(server.http_url)
        data = np.array([[b"a"]] if batched else [b"a"], dtype=object)
        tensor = http.InferInput("x", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        return int(client.infer(model, [tensor]).as_numpy("y").reshape(-1)[0])

    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        return list(pool.map(one, range(requests)))


def test_t9_dynamic_batching_is_ignored_without_max_batch_size(server):
    # The same 24 requests at once: the batching model takes several per execute, the unbatched one never does,
    # although its config asks for dynamic batching too and loads without a word (why the core takes one request
    # per execute when its outputs are the streaming ensemble's unbatched public tensors).
    assert max(_execute_sizes(server, "batched", 24, batched=True)) > 1
    assert set(_execute_sizes(server, "unbatched", 24, batched=False)) == {1}


def test_t10_tritonserver_starts_the_thread_pool_for_every_python_instance(server):
    instances = sum(count for _, count in MODELS.values())
    threads = len(list(Path(f"/proc/{server.process.pid}/task").iterdir()))
    assert instances * POOL <= threads < (instances + 1) * POOL, json.dumps(
        {"threads": threads, "instances": instances, "pool": POOL}
    )


def test_t9_a_batching_model_cannot_declare_a_per_sequence_output(tmp_path: Path):
    # The streaming ensemble's public text_output is dims [-1] (one element per sequence). A batching model declares
    # its tensors after the batch dimension, so it would give that output as dims [], which tritonserver refuses:
    # why the core that runs the postprocess stage in its sender cannot batch its intake.
    (tmp_path / "vector" / "1").mkdir(parents=True)
    (tmp_path / "vector" / "1" / "model.py").write_text(MODEL_PY)
    config = CONFIG.format(name="vector", max_batch_size=8, count=1).replace(
        'name: "y" data_type: TYPE_STRING dims: [1]', 'name: "y" data_type: TYPE_STRING dims: []'
    )
    assert "dims: []" in config
    (tmp_path / "vector" / "config.pbtxt").write_text(config)
    with pytest.raises(ModelLoadError) as refused:
        start_on_free_ports(tmp_path, tmp_path / "tritonserver.log", timeout=120)
    assert [f.model for f in refused.value.failures] == ["vector"]
    assert "model output 'y' must specify 'dims'" in str(refused.value)


_LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")


def _logged_at(log_text: str, needle: str) -> float:
    """Seconds of the day at which Triton logged the first line containing `needle`."""
    for line in log_text.splitlines():
        if needle in line and (match := _LOG_TIME.match(line)):
            hours, minutes, seconds = match.groups()
            return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    raise AssertionError(f"no log line with {needle!r}")


def test_t11_a_python_model_unloads_its_instances_one_after_another_a_second_each(tmp_path: Path):
    # Each instance's teardown starts with the backend's fixed 1 s health probe of its stub, one instance after the
    # other, while models unload side by side: why the launcher's exit timeout grows with the largest model.
    counts = {"one": 1, "four": 4}
    for name, count in counts.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(MODEL_PY)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.format(name=name, max_batch_size=0, count=count))
    assert python_instance_counts(tmp_path) == counts
    server = start_on_free_ports(tmp_path, tmp_path / "tritonserver.log", timeout=120)
    assert server.exit_timeout_secs == exit_timeout_for(tmp_path)
    code = server.stop()
    log = server.log_text()
    assert code == 0 and "Exit timeout expired" not in log
    unloading = _logged_at(log, "All models are stopped, unloading models")
    took = {name: _logged_at(log, f"successfully unloaded '{name}'") - unloading for name in counts}
    print(f"\nunload seconds after the stop began: {took}")
    assert 1.0 <= took["one"] < 3.0, took
    assert 4.0 <= took["four"] < exit_timeout_for(tmp_path), took
