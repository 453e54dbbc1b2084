"""TritonServer.start_and_wait with a server already launched (tools/bench.py --parallel-starts boots several at once):
the launched process is waited for, not started a second time; one that dies before it is ready is started again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.triton_server import TritonServer


def _server(tmp_path: Path, ready: list[bool]) -> tuple[TritonServer, list[tuple[int, int, int]]]:
    """A server whose start records its ports and whose waits answer from `ready`, in order (False: it exited)."""
    server = TritonServer(tmp_path, log_file=tmp_path / "tritonserver.log")
    starts: list[tuple[int, int, int]] = []

    def start() -> None:
        starts.append((server.http_port, server.grpc_port, server.metrics_port))

    def wait_ready(timeout: float = 300.0) -> float:
        if not ready.pop(0):
            raise RuntimeError("tritonserver exited with code 1 before it was ready")
        return 1.0

    server.start = start  # type: ignore[method-assign]
    server.wait_ready = wait_ready  # type: ignore[method-assign]
    server.stop = lambda grace=None: None  # type: ignore[method-assign]
    return server, starts


def test_a_launched_server_is_waited_for_without_a_second_start(tmp_path: Path):
    server, starts = _server(tmp_path, ready=[True])
    assert server.start_and_wait(timeout=5, new_ports=True, launched=True) == 1.0
    assert starts == []


def test_a_launched_server_that_died_before_ready_is_started_again_on_new_ports(tmp_path: Path):
    server, starts = _server(tmp_path, ready=[False, True])
    server.use_free_ports()
    launched_ports = (server.http_port, server.grpc_port, server.metrics_port)
    assert server.start_and_wait(timeout=5, new_ports=True, launched=True) == 1.0
    assert len(starts) == 1 and starts[0] != launched_ports


def test_a_launched_server_that_dies_twice_is_reported(tmp_path: Path):
    server, starts = _server(tmp_path, ready=[False, False])
    with pytest.raises(RuntimeError, match="before it was ready"):
        server.start_and_wait(timeout=5, new_ports=True, launched=True)
    assert len(starts) == 1
