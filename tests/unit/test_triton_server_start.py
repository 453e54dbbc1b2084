"""TritonServer.start_and_wait with a server already launched (tools/bench.py --parallel-starts boots several at once):
the launched process is waited for, not started a second time; one that dies before it is ready is started again.
The ports a server gets, and what counts as ready."""

from __future__ import annotations

import contextlib
import http.server
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import triton_server
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


def test_free_ports_lie_below_the_kernels_ephemeral_range_and_are_free(tmp_path: Path, monkeypatch):
    # An outgoing connection's automatic port comes from the ephemeral range: a port picked there can be taken
    # before tritonserver binds it. A range file of our own shows the pick follows the kernel's setting.
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("30000\t60999\n")
    monkeypatch.setattr(triton_server, "EPHEMERAL_PORT_RANGE", range_file)
    ports = triton_server.free_ports(5)
    assert len(set(ports)) == 5
    assert all(triton_server.LISTEN_PORTS_FROM <= port < 30000 for port in ports)
    for port in ports:  # free: each can be bound now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_ports_pass_over_a_port_in_use(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            free = other.getsockname()[1]
        picks = iter([port, port, free])
        monkeypatch.setattr(triton_server.random, "choice", lambda candidates: next(picks))
        monkeypatch.setattr(triton_server, "ephemeral_ports_start", lambda: 65535)
        monkeypatch.setattr(triton_server, "LISTEN_PORTS_FROM", 1024)
        assert triton_server.free_ports(1) == [free]


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _http_answering() -> Iterator[int]:
    """An HTTP server on a free port that answers 200 to every GET, for as long as the block runs."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _server_process(tmp_path: Path, http_port: int, metrics_port: int, seconds: float) -> TritonServer:
    """A TritonServer whose 'process' is a sleep of `seconds`, its ports the given ones."""
    server = TritonServer(tmp_path, http_port=http_port, metrics_port=metrics_port, log_file=tmp_path / "log")
    server.process = subprocess.Popen(["sleep", str(seconds)])
    return server


def test_a_server_ready_on_http_whose_metrics_never_answer_and_that_exits_is_not_ready(tmp_path: Path):
    # tritonserver 2.51 starts its metrics service after HTTP and exits when the metrics port is taken: HTTP's
    # readiness alone came just before such a server went down (CI, 2026-12-07).
    with _http_answering() as http_port:
        server = _server_process(tmp_path, http_port, metrics_port=triton_server.free_port(), seconds=1)
        try:
            with pytest.raises(RuntimeError, match="exited with code 0 before it was ready"):
                server.wait_ready(timeout=20)
        finally:
            server.process.kill()
            server.process.wait()


def test_a_server_whose_http_and_metrics_answer_is_ready(tmp_path: Path):
    with _http_answering() as http_port, _http_answering() as metrics_port:
        server = _server_process(tmp_path, http_port, metrics_port, seconds=30)
        try:
            assert server.wait_ready(timeout=20) < 5
        finally:
            server.process.kill()
            server.process.wait()
