"""The benchmark's clients (tools/bench_clients.py) against the real server: each Triton path's client, in this
process and spread over client processes, gets every request answered and measures what it claims."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL
from tools.bench_clients import ClientSpec, Prompt, open_runner

pytestmark = pytest.mark.server

PROMPTS = [Prompt([], "The capital of France is"), Prompt([], "Once upon a time")]
MAX_TOKENS = 4


async def _level(spec: ClientSpec, processes: int, concurrency: int, total: int):
    runner = await open_runner(spec, processes)
    try:
        await runner.prepare(PROMPTS, concurrency, total, MAX_TOKENS)
        return await runner.run()
    finally:
        await runner.close()


@pytest.mark.parametrize("processes", [1, 3])
def test_streamed_level_runs_every_request_and_times_its_first_token(server, processes: int):
    run = asyncio.run(_level(ClientSpec("grpc-stream", server.grpc_url, STREAM_MODEL), processes, 4, 10))
    assert len(run.samples) == 10
    assert all(s.ttft is not None and 0 < s.ttft <= s.latency for s in run.samples)
    assert sum(s.output_tokens for s in run.samples) == 10 * MAX_TOKENS
    # The requests overlapped (4 in flight), and the wall time spans all of them.
    assert max(s.latency for s in run.samples) <= run.wall < sum(s.latency for s in run.samples)
    assert run.client_cpu_seconds > 0


@pytest.mark.parametrize("kind", ["grpc-infer", "http-generate"])
def test_plain_level_over_client_processes(server, kind: str):
    address = server.grpc_url if kind == "grpc-infer" else server.http_url
    run = asyncio.run(_level(ClientSpec(kind, address, PLAIN_MODEL), 2, 3, 7))
    assert len(run.samples) == 7
    assert all(s.ttft is None and s.latency > 0 for s in run.samples)


def test_a_failing_request_in_a_client_process_fails_the_level(server):
    with pytest.raises(RuntimeError, match="client process"):
        asyncio.run(_level(ClientSpec("grpc-infer", server.grpc_url, "no_such_model"), 2, 2, 2))
