"""The benchmark's clients (tools/bench_clients.py) against the real server: each Triton path's client, in this
process and spread over client processes, gets every request answered and measures what it claims."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL
from tools.bench_clients import ClientSpec, Prompt, StreamPool, generated_tokens, open_runner, run_level

pytestmark = pytest.mark.server

PROMPTS = [Prompt([], "The capital of France is"), Prompt([], "Once upon a time")]
MAX_TOKENS = 4


async def _level(
    spec: ClientSpec,
    processes: int,
    concurrency: int,
    total: int,
    stagger: float = 0.0,
    warm: bool = False,
):
    runner = await open_runner(spec, processes)
    try:
        await runner.prepare(PROMPTS, concurrency, total, MAX_TOKENS, stagger, warm=warm)
        return await runner.run()
    finally:
        await runner.close()


def _requests(server) -> int:
    return int(server.model_stats(PLAIN_MODEL)[PLAIN_MODEL]["inference_count"])


def _requests_reaching(server, expected: int) -> int:
    """The plain model's requests so far by Triton's statistics, once they reach `expected` (or after 10 s)."""
    deadline = time.monotonic() + 10
    while (count := _requests(server)) < expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return count


def _settled_requests(server) -> int:
    """The plain model's requests so far, once two readings half a second apart agree (earlier tests' are in)."""
    count = _requests(server)
    for _ in range(20):
        time.sleep(0.5)
        if (again := _requests(server)) == count:
            return count
        count = again
    return count


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


def test_a_staggered_level_over_client_processes_starts_its_last_stream_late(server):
    # 4 streams over 2 processes, spread over 3 s: the streams start at 0, 0.75, 1.5 and 2.25 s (interleaved)
    run = asyncio.run(_level(ClientSpec("grpc-infer", server.grpc_url, PLAIN_MODEL), 2, 4, 4, stagger=3.0))
    assert len(run.samples) == 4
    assert run.wall >= 2.25
    assert run.wall < 2.25 + max(s.latency for s in run.samples) + 1.0  # not 3 s per process: the phases differ


@pytest.mark.parametrize("processes", [1, 2])
def test_a_level_warms_up_with_the_requests_it_is_given(server, processes: int):
    spec = ClientSpec("grpc-infer", server.grpc_url, PLAIN_MODEL)
    before = _settled_requests(server)
    # none: a later slice of a one-stream level (tools/bench.py --one-stream-slices), its path warm already
    run = asyncio.run(_level(spec, processes, 2, 5, warm=True))
    assert len(run.samples) == 5
    assert _requests_reaching(server, before + 5) == before + 5
    time.sleep(0.5)  # nothing more arrives late
    assert _requests_reaching(server, before + 5) == before + 5
    # by default one request per stream (up to 16) before the level
    asyncio.run(_level(spec, processes, 2, 5))
    assert _requests_reaching(server, before + 12) == before + 12


def test_a_failing_request_in_a_client_process_fails_the_level(server):
    with pytest.raises(RuntimeError, match="client process"):
        asyncio.run(_level(ClientSpec("grpc-infer", server.grpc_url, "no_such_model"), 2, 2, 2))


def test_streamed_level_with_a_stream_per_request(server):
    spec = ClientSpec("grpc-stream-per-request", server.grpc_url, STREAM_MODEL)
    run = asyncio.run(_level(spec, 1, 3, 7))
    assert len(run.samples) == 7
    assert all(s.ttft is not None and 0 < s.ttft <= s.latency for s in run.samples)


def test_long_lived_streams_carry_many_requests_and_drop_a_failed_one(server):
    async def scenario():
        pool = StreamPool(ClientSpec("grpc-stream", server.grpc_url, STREAM_MODEL))
        try:
            samples, _ = await run_level(pool.send, PROMPTS, 3, 12, MAX_TOKENS)
            opened = len(pool.opened)
            with pytest.raises(RuntimeError, match="max_tokens"):  # refused by preprocess: an error response
                await pool.send(PROMPTS[0], -1)
            # Three at once after the error: two idle streams are left, so one more is opened.
            after_error = await asyncio.gather(*(pool.send(PROMPTS[1], MAX_TOKENS) for _ in range(3)))
            return samples, opened, after_error, len(pool.opened)
        finally:
            await pool.close()

    samples, opened, after_error, opened_in_the_end = asyncio.run(scenario())
    assert len(samples) == 12 and all(s.ttft is not None for s in samples)
    assert opened == 3  # one stream per concurrent request, each reused over the 12 requests
    assert all(s.ttft is not None and s.output_tokens == MAX_TOKENS for s in after_error)
    assert opened_in_the_end == 4  # the stream that carried the error was dropped, not reused


@pytest.mark.parametrize(
    ("kind", "model"),
    [
        ("grpc-infer", PLAIN_MODEL),
        ("http-generate", PLAIN_MODEL),
        ("grpc-stream", STREAM_MODEL),
        ("grpc-stream-per-request", STREAM_MODEL),
    ],
)
def test_the_token_check_counts_what_the_server_generated_for_each_prompt(server, kind: str, model: str):
    address = server.http_url if kind == "http-generate" else server.grpc_url
    spec = ClientSpec(kind, address, model)
    assert asyncio.run(generated_tokens(spec, PROMPTS, MAX_TOKENS, 2)) == [MAX_TOKENS] * len(PROMPTS)
    # a streamed request's count adds up its responses' own (each response counts the tokens it brings)
    assert asyncio.run(generated_tokens(spec, PROMPTS[:1], 1, 1)) == [1]
    assert asyncio.run(generated_tokens(spec, PROMPTS[:1], 7, 1)) == [7]
