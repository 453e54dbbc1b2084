"""Several front ends of one engine (core/front_ends.py, `core.front_ends`): which instance is which, where their
sockets are, how front end 0 tells the others the engine is up (or failed), the watch on the engine's processes,
and the settings and render rules. Without vLLM: the real server test is tests/integration/test_front_ends.py."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import yaml

import repo_render
from core import front_ends
from core.engine import Engine
from core.settings import CoreSettings
from repo_render.schema import ConfigError


def test_one_front_end_is_the_plain_engine():
    assert front_ends.front_end(1, "vllm_core_0_0", "vllm_core") is None


def test_instances_are_told_apart_by_their_names(tmp_path, monkeypatch):
    monkeypatch.setattr(front_ends.tempfile, "gettempdir", lambda: str(tmp_path))
    first = front_ends.front_end(3, "vllm_core_0_0", "vllm_core", server_pid=42)
    third = front_ends.front_end(3, "vllm_core_0_2", "vllm_core", server_pid=42)
    assert (first.index, third.index) == (0, 2) and first.launches_engine and not third.launches_engine
    assert first.socket_dir == third.socket_dir == tmp_path / "tvllm-fe-42-vllm_core"
    assert third.client_addresses() == {
        "input_address": f"ipc://{tmp_path}/tvllm-fe-42-vllm_core/in-2",
        "output_address": f"ipc://{tmp_path}/tvllm-fe-42-vllm_core/out-2",
    }
    other_server = front_ends.front_end(3, "vllm_core_0_0", "vllm_core", server_pid=43)
    assert other_server.socket_dir != first.socket_dir
    with pytest.raises(ValueError, match="front end 3"):
        front_ends.front_end(3, "vllm_core_0_3", "vllm_core", server_pid=42)
    with pytest.raises(ValueError, match="instance index"):
        front_ends.instance_index("vllm_core")
    # entry: plain-core: the plain model's instances come after the core's, with the core's sockets
    plain = front_ends.front_end(5, "vllm_model_0_1", "vllm_core", server_pid=42, first=3)
    assert plain.index == 4 and not plain.launches_engine and plain.socket_dir == first.socket_dir
    with pytest.raises(ValueError, match="front end 5"):
        front_ends.front_end(5, "vllm_model_0_2", "vllm_core", server_pid=42, first=3)


def _fe(tmp_path, index=1):
    return front_ends.FrontEnd(index, 2, tmp_path)


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_others_read_the_engine_pids_front_end_0_published(tmp_path):
    fe = _fe(tmp_path)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        front_ends.publish_engine_pids(_fe(tmp_path, 0), [alive.pid])
        assert front_ends.read_engine_pids(fe, wait_seconds=1) == [alive.pid]
    finally:
        alive.kill()
        alive.wait()
    # an earlier engine's ids (its processes ended) do not count: the reader waits, then says so
    front_ends.publish_engine_pids(_fe(tmp_path, 0), [_ended_pid()])
    with pytest.raises(RuntimeError, match="not up in 0 s"):
        front_ends.read_engine_pids(fe, wait_seconds=0.2)


def test_a_failed_launch_fails_the_others_with_its_reason(tmp_path):
    front_ends.publish_launch_failure(_fe(tmp_path, 0), ValueError("no such model"))
    with pytest.raises(RuntimeError, match="front end 0 could not start the engine: ValueError: no such model"):
        front_ends.read_engine_pids(_fe(tmp_path), wait_seconds=5)
    front_ends.clear_published(_fe(tmp_path, 0))  # the next launch starts clean
    with pytest.raises(RuntimeError, match="not up"):
        front_ends.read_engine_pids(_fe(tmp_path), wait_seconds=0.1)


def test_the_watch_reports_an_ended_engine_once_and_stops_when_told():
    deaths: list[int] = []
    done = threading.Event()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    watch = front_ends.watch_engine([child.pid], lambda pid: (deaths.append(pid), done.set()), threading.Event())
    assert done.wait(10), "the watch did not see the engine process end"
    watch.join(2)
    assert deaths == [child.pid] and not watch.is_alive()
    child.wait()

    stop = threading.Event()
    quiet = front_ends.watch_engine([_ended_pid()], deaths.append, stop)
    stop.set()  # set before its first look (0.25 s): nothing is reported
    quiet.join(2)
    assert deaths == [child.pid]


@pytest.mark.parametrize(
    ("settings", "rule"),
    [
        ({}, "health.restart_engine: false"),
        (
            {"health": {"restart_engine": False}, "engine_env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}},
            "VLLM_ENABLE_V1_MULTIPROCESSING",
        ),
    ],
)
def test_settings_refuse_what_a_shared_engine_cannot_do(settings, rule):
    with pytest.raises(ValueError, match=rule):
        CoreSettings.model_validate({"core": {"front_ends": 2}, **settings})
    assert CoreSettings.model_validate({"core": {"front_ends": 1}, **settings}).core.front_ends == 1


def _deployment(tmp_path, **overrides):
    doc = yaml.safe_load(repo_render.DEFAULT_CONFIG.read_text())
    doc.update(overrides)
    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(doc))
    deployment = repo_render.load_deployment(path)
    deployment.base_dir = repo_render.DEFAULT_CONFIG.parent
    return deployment


SHARED = {"core": {"front_ends": 3}, "health": {"restart_engine": False}, "engine_env": {}}


def test_the_core_has_one_instance_per_front_end(tmp_path):
    files = repo_render.render(_deployment(tmp_path, **SHARED), tmp_path / "repository")
    assert "count: 3" in files["vllm_core/config.pbtxt"]
    assert "count: 1" in repo_render.render(_deployment(tmp_path), tmp_path / "one")["vllm_core/config.pbtxt"]


def test_entry_models_need_a_single_front_end(tmp_path):
    """entry: bls cancels by key, which lives in one front end; entry: plain-bls watches no cancels."""
    with pytest.raises(ConfigError, match="entry: ensemble, plain-bls or plain-core only"):
        repo_render.render(_deployment(tmp_path, entry="bls", **SHARED), tmp_path / "repository")
    files = repo_render.render(_deployment(tmp_path, entry="plain-bls", **SHARED), tmp_path / "plain-bls")
    assert "count: 3" in files["vllm_core/config.pbtxt"] and "EntryModel" in files["vllm_model/1/model.py"]


def test_a_deployment_names_the_missing_rule(tmp_path):
    with pytest.raises(ConfigError, match="health.restart_engine: false"):
        _deployment(tmp_path, core={"front_ends": 2}, engine_env={})


def test_the_others_can_tell_a_stop_from_a_death(tmp_path):
    first = _fe(tmp_path, 0)
    front_ends.publish_engine_pids(first, [12345])
    assert not front_ends.engine_stopped(_fe(tmp_path))  # published: an ended process is a death
    front_ends.clear_published(first)  # front end 0 withdraws the engine before it stops it
    assert front_ends.engine_stopped(_fe(tmp_path))


def test_a_launched_engine_makes_statistics_when_a_stat_logger_of_ours_wants_them():
    """vLLM's rule (AsyncLLM: log_stats or a custom logger): front end 0 launches the shared EngineCore itself, so
    with `metrics: true` and `disable_log_stats: true` it must still ask for the scheduler's statistics (the
    gauges), or the metrics' gauges would never move."""
    quiet = {"disable_log_stats": True}
    assert Engine(quiet, stat_loggers=[object()])._log_stats()
    assert not Engine(quiet)._log_stats()
    assert Engine({})._log_stats()  # vLLM's default: on
