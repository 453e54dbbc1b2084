"""A client's cancel stops generation in the engine (docs/platform-notes.md T5), measured with vLLM's own gauges.

The main server here renders the deployment with `entry: bls` (Python entry models instead of ensembles: on Triton
2.51 a cancel never reaches a step inside an ensemble) and metrics enabled, so vLLM's running/waiting gauges
are readable in /metrics. CANCEL_STREAMS (default 200) sizes the main test. A second server renders `entry:
plain-core` with `generate.watch_cancels` (its plain model is the core itself, the client's own model).

The tiny model generates a long request in about a second, so "the engine is free soon" alone would also pass
with no cancel at all: each test also counts the tokens the engine generated (vLLM's generation-token counter)
and requires the cancelled requests to have made well under their max_tokens. The server allows 2048-token
sequences so that single cancelled requests run for seconds if the cancel does not work.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import requests

from tests.support.reliability_helpers import default_engine_args, render_repository, scrape, start_server, vllm_metric
from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL, env_int, grpc_infer, grpc_inputs, text_of

pytestmark = pytest.mark.server

PROMPT = "Once upon a time, a small robot"
LONG = {"temperature": 0, "max_tokens": 480, "ignore_eos": True}
VERY_LONG = {"temperature": 0, "max_tokens": 2000, "ignore_eos": True}  # ~4 s alone on the tiny model
ONE = {"temperature": 0, "max_tokens": 7, "ignore_eos": True}


@pytest.fixture(scope="module")
def bls_server(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("bls")
    repository = render_repository(
        work / "repository", entry="bls", metrics=True, engine_args=default_engine_args(max_model_len=2048)
    )
    server = start_server(repository, work / "tritonserver.log")
    yield server
    server.stop()


def in_engine(server) -> float:
    samples = scrape(server)
    running = vllm_metric(samples, "vllm:num_requests_running")
    waiting = vllm_metric(samples, "vllm:num_requests_waiting")
    assert running is not None and waiting is not None, "vLLM's gauges are missing from /metrics"
    return running + waiting


def generated_tokens(server) -> float:
    """vLLM's generation-token counter, once the engine is idle (the publisher flushes every ~0.2 s)."""
    assert wait_for(lambda: in_engine(server) == 0, 60) is not None, "requests left in the engine"
    time.sleep(0.6)
    value = vllm_metric(scrape(server), "vllm:generation_tokens_total")
    assert value is not None, "vLLM's generation-token counter is missing from /metrics"
    return value


def wait_for(condition, timeout: float, step: float = 0.05) -> float | None:
    """Seconds until condition() is true, or None."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(step)
    return None


def test_cancel_half_of_the_streams_frees_the_engine_and_the_rest_finish(bls_server):
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aioclient

    total = env_int("CANCEL_STREAMS", 200)
    with grpcclient.InferenceServerClient(bls_server.grpc_url) as client:
        expected = text_of(grpc_infer(client, PROMPT, LONG, exclude_input_in_output=True))
    tokens_before = generated_tokens(bls_server)

    async def run():
        client = aioclient.InferenceServerClient(bls_server.grpc_url)

        async def stream(i: int) -> tuple[str, bool]:
            async def requests_():
                yield {
                    "model_name": STREAM_MODEL,
                    "inputs": grpc_inputs(PROMPT, LONG, stream=True, exclude_input_in_output=True),
                    "request_id": f"r{i}",
                }
                await asyncio.sleep(3600)  # keep the request side open; the stream ends by its final response

            text, final = [], False
            responses = client.stream_infer(requests_())
            calls[i] = responses
            async for result, error in responses:
                assert error is None, error
                text.append(result.as_numpy("text_output").reshape(-1)[0].decode())
                if result.get_response().parameters["triton_final_response"].bool_param:
                    final = True
                    break
            return "".join(text), final

        calls: dict[int, object] = {}  # the stream iterators: cancel() cancels the gRPC call itself
        tasks = [asyncio.create_task(stream(i)) for i in range(total)]
        # Cancel once every request is in the engine (the engine outruns the clients' delta consumption, so
        # waiting for each stream's first delta could find the engine already done).
        # Well over the half that stays (the clients start their streams at different speeds, so not all 200 need
        # be in at one moment: a CI run peaked below 3/4 and the wait ran out while every stream finished).
        await asyncio.to_thread(wait_for, lambda: in_engine(bls_server) >= total * 6 // 10, 300)
        before = await asyncio.to_thread(in_engine, bls_server)
        cancel_at = time.monotonic()
        for i, task in enumerate(tasks):
            if i % 2 == 0:
                calls[i].cancel()  # the client's cancel: the RPC ends, as when a client goes away
                task.cancel()
        freed_after = await asyncio.to_thread(wait_for, lambda: in_engine(bls_server) <= total // 2, 30)
        results = await asyncio.gather(*tasks[1::2], return_exceptions=True)
        done_after = time.monotonic() - cancel_at
        await client.close()
        return before, freed_after, results, done_after

    before, freed_after, results, done_after = asyncio.run(run())
    # The uncancelled half made all their tokens; what is left over is the cancelled half's
    cancelled_made = generated_tokens(bls_server) - tokens_before - (total - total // 2) * LONG["max_tokens"]
    print(
        f"\ncancel: {total} streams, {before:.0f} in the engine; {total // 2} cancelled; engine down to the rest"
        f" after {freed_after}s; the rest finished {done_after:.1f} s after the cancel; the cancelled made"
        f" {cancelled_made / (total // 2):.0f} tokens each on average, of {LONG['max_tokens']}"
    )
    assert cancelled_made <= total // 2 * LONG["max_tokens"] / 2, "the cancelled streams were not stopped early"
    assert before > total // 2, f"only {before} requests were in the engine before the cancel"
    # The target is 2 s; measured 3.8-11.9 s at 200 streams on a loaded 2-core machine (one entry
    # instance polls is_cancelled() behind the stream traffic). This bound catches a cancel that does not work
    # at all; CANCEL_BOUND_SECONDS tightens it.
    bound = float(os.environ.get("CANCEL_BOUND_SECONDS", "20"))
    assert freed_after is not None and freed_after <= bound, f"engine still ran cancelled requests ({freed_after})"
    failures = [r for r in results if isinstance(r, BaseException) or r != (expected, True)]
    assert failures == [], f"{len(failures)} of the uncancelled streams went wrong: {failures[:2]}"


def test_sse_disconnect_aborts_the_engine_request(bls_server):
    tokens_before = generated_tokens(bls_server)
    payload = {"text_input": PROMPT, "stream": True, "exclude_input_in_output": True, "parameters": VERY_LONG}
    reply = requests.post(
        f"http://{bls_server.http_url}/v2/models/{STREAM_MODEL}/generate_stream", json=payload, stream=True, timeout=60
    )
    lines = reply.iter_lines()
    while not next(lines).startswith(b"data: "):
        pass
    # /metrics is published every ~0.2 s: wait for the gauge rather than read it once
    assert wait_for(lambda: in_engine(bls_server) == 1, 5) is not None, "the streamed request never showed"
    reply.close()
    freed = wait_for(lambda: in_engine(bls_server) == 0, 10)
    made = generated_tokens(bls_server) - tokens_before
    print(f"\nSSE disconnect: engine free after {freed}s, {made:.0f} of {VERY_LONG['max_tokens']} tokens made")
    assert freed is not None and freed <= 6.0  # measured 0.05-0.31 s; generous for a loaded CI machine
    assert made <= VERY_LONG["max_tokens"] / 2


def test_grpc_plain_request_timeout_aborts_the_engine_request(bls_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tokens_before = generated_tokens(bls_server)
    client = grpcclient.InferenceServerClient(bls_server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer(PLAIN_MODEL, grpc_inputs(PROMPT, VERY_LONG, exclude_input_in_output=True), client_timeout=0.25)
    client.close()
    freed = wait_for(lambda: in_engine(bls_server) == 0, 10)
    made = generated_tokens(bls_server) - tokens_before
    print(f"\ngRPC deadline: engine free {freed}s after the client's timeout, {made:.0f} tokens made")
    # Triton notices a unary RPC's deadline later than a stream cancel (measured 2.3-3.5 s on a busy machine)
    assert freed is not None and freed <= 6.0
    assert made <= VERY_LONG["max_tokens"] * 3 / 4  # the slow deadline notice above costs tokens


@pytest.fixture(scope="module")
def plain_core_server(tiny_model, tmp_path_factory):
    """entry: plain-core with generate.watch_cancels: the plain public model is the core's adapter itself, the
    client's own model, so it can see a plain client's cancel; the streaming one stays the ensemble."""
    work = tmp_path_factory.mktemp("plain-core")
    repository = render_repository(
        work / "repository",
        entry="plain-core",
        metrics=True,
        engine_args=default_engine_args(max_model_len=2048),
        generate={"instances": 1, "watch_cancels": True},
        health={"restart_engine": False},
        engine_env={"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    server = start_server(repository, work / "tritonserver.log")
    yield server
    server.stop()


def test_plain_core_watching_cancels_aborts_a_timed_out_plain_request(plain_core_server):
    """Without generate.watch_cancels this request would run to its 2000 tokens (as every plain request of an
    ensemble does, docs/reliability.md); with it the engine is freed after the client's deadline."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server = plain_core_server
    tokens_before = generated_tokens(server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer(PLAIN_MODEL, grpc_inputs(PROMPT, VERY_LONG, exclude_input_in_output=True), client_timeout=0.25)
    freed = wait_for(lambda: in_engine(server) == 0, 10)
    made = generated_tokens(server) - tokens_before
    print(f"\nplain-core, gRPC deadline: engine free {freed}s after the client's timeout, {made:.0f} tokens made")
    assert freed is not None and freed <= 6.0  # Triton notices a unary deadline in seconds (the bls test above)
    assert made <= VERY_LONG["max_tokens"] * 3 / 4
    # the model goes on serving: a request that is not cancelled is answered whole
    answer = client.infer(PLAIN_MODEL, grpc_inputs(PROMPT, ONE, exclude_input_in_output=True), client_timeout=60)
    client.close()
    assert answer.as_numpy("text_output")[0] and generated_tokens(server) - tokens_before - made == ONE["max_tokens"]


# A client process with three long requests open: a plain gRPC infer, a gRPC stream and an SSE stream.
_CLIENT = """
import sys, threading, time
import requests
import tritonclient.grpc as grpcclient
from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL, grpc_inputs

url, http_url, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
long = {"temperature": 0, "max_tokens": 2000, "ignore_eos": True}
plain = grpcclient.InferenceServerClient(url)
threading.Thread(target=plain.infer, args=(PLAIN_MODEL, grpc_inputs(prompt, long)), daemon=True).start()
streaming = grpcclient.InferenceServerClient(url)
streaming.start_stream(callback=lambda result, error: None)
streaming.async_stream_infer(STREAM_MODEL, grpc_inputs(prompt, long, stream=True))
body = {"text_input": prompt, "stream": True, "parameters": long}
sse = requests.post(f"http://{http_url}/v2/models/{STREAM_MODEL}/generate_stream", json=body, stream=True)
print("sent", flush=True)
time.sleep(3600)
"""


def test_killed_client_aborts_its_engine_requests(bls_server):
    import signal
    import subprocess
    import sys

    from tests.support.reliability_helpers import ROOT

    tokens_before = generated_tokens(bls_server)
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT, bls_server.grpc_url, bls_server.http_url, PROMPT],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout.readline().strip() == "sent"
        assert wait_for(lambda: in_engine(bls_server) == 3, 30) is not None, "the client's requests never showed"
    finally:
        client.send_signal(signal.SIGKILL)
        client.wait()
    freed = wait_for(lambda: in_engine(bls_server) == 0, 15)
    made = generated_tokens(bls_server) - tokens_before
    print(f"\nkilled client (plain gRPC, gRPC stream, SSE): engine free after {freed}s, {made:.0f} tokens made")
    assert freed is not None and freed <= 10.0  # the plain RPC's cancel is the slowest (see the deadline test)
    assert made <= 3 * 2000 / 2, "the killed client's requests ran on"


def test_metrics_move_by_exactly_one_requests_counts(bls_server):
    import tritonclient.grpc as grpcclient

    names = {
        "vllm:prompt_tokens_total": None,
        "vllm:generation_tokens_total": 7,
        "vllm:request_success_total": 1,
        "vllm:time_to_first_token_seconds_count": 1,
        "vllm:time_per_output_token_seconds_count": 1,
        "vllm:e2e_request_latency_seconds_count": 1,
        "vllm:request_prompt_tokens_count": 1,
        "vllm:request_generation_tokens_count": 1,
        "vllm:request_generation_tokens_sum": 7,
    }
    assert wait_for(lambda: in_engine(bls_server) == 0, 60) is not None
    time.sleep(1.0)  # the publisher's last batch
    before = scrape(bls_server)
    client = grpcclient.InferenceServerClient(bls_server.grpc_url)
    out = client.infer(
        PLAIN_MODEL, grpc_inputs(PROMPT, ONE, exclude_input_in_output=True, return_num_input_tokens=True)
    )
    client.close()
    prompt_tokens = int(out.as_numpy("num_input_tokens")[0])
    names["vllm:prompt_tokens_total"] = prompt_tokens
    names["vllm:request_prompt_tokens_sum"] = prompt_tokens

    def moved() -> dict[str, float]:
        after = scrape(bls_server)
        return {n: vllm_metric(after, n) - vllm_metric(before, n) for n in names}

    wait_for(lambda: moved() == names, 10)
    assert moved() == names
    assert vllm_metric(scrape(bls_server), "vllm:kv_cache_usage_perc") is not None
