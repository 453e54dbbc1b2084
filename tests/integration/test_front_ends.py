"""Several front ends of one engine (`core.front_ends`, core/front_ends.py) in a real server: the core's two
Triton instances each attach a vLLM client to the one EngineCore that instance 0 launched, both take requests,
greedy outputs agree between the plain and the streamed path, vLLM's metrics count every request once across
the front ends (one series per metric, idle gauges at 0), and when the shared EngineCore dies every request (in
flight, or new on either instance) gets UNAVAILABLE quickly while the server stays up."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from core.core_stats import ENVIRONMENT_KEY as CORE_STATS_KEY
from core.step_stats import combine, parse_line
from tests.integration.test_engine_failure import LONG_ENGINE_ARGS, QUICK_SECONDS, _kill_in_flight
from tests.support.reliability_helpers import engine_cores, render_repository, scrape
from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL, grpc_inputs, grpc_stream
from tools.triton_server import start_on_free_ports

pytestmark = pytest.mark.server

FRONT_ENDS = 2
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
_STATS = re.compile(r"vllm_core stats: (\d+) requests/s .*\(front end (\d+) of (\d+)\)")


def _ask_all(client, prompts: list[str]) -> dict[str, str]:
    """Each prompt's plain greedy text, all asked at once (one thread each)."""
    plain: dict[str, str] = {}

    def ask(prompt: str) -> None:
        result = client.infer(PLAIN_MODEL, grpc_inputs(prompt, GREEDY), client_timeout=120)
        plain[prompt] = result.as_numpy("text_output")[0].decode()

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert sorted(plain) == sorted(prompts)
    return plain


def _running(server) -> list[float]:
    return [v for (name, _), v in scrape(server).items() if name == "vllm:num_requests_running"]


def test_two_front_ends_share_one_engine_and_fail_fast_when_it_dies(tiny_model, tmp_path):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    repository = render_repository(
        tmp_path / "repository",
        entry="ensemble",
        core={"front_ends": FRONT_ENDS},
        health={"restart_engine": False},
        metrics=True,
        engine_args=LONG_ENGINE_ARGS,  # the in-flight requests that the engine's death fails are long
        # one EngineCore process for every front end: vLLM's multiprocessing on (the CPU default turns it off)
        engine_env={"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    log = tmp_path / "tritonserver.log"
    server = start_on_free_ports(repository, log, environment={CORE_STATS_KEY: "1"})
    try:
        engines = engine_cores(server)
        assert len(engines) == 1, f"one EngineCore for {FRONT_ENDS} front ends, found {engines}"
        client = grpcclient.InferenceServerClient(server.grpc_url)

        prompts = [f"Story {i}: once upon a time" for i in range(24)]
        plain = _ask_all(client, prompts)
        for prompt in prompts[:3]:
            deltas = grpc_stream(server.grpc_url, grpc_inputs(prompt, GREEDY, stream=True))
            streamed = "".join(d["text_output"][0].decode() for d, _ in deltas)
            assert prompt + streamed == plain[prompt], (prompt, streamed, plain[prompt])  # plain echoes the prompt

        time.sleep(2.5)  # the core logs its counters every second, at the end of each interval
        # vLLM's line per request ("Added request ...") stays off, as with one front end (enable_log_requests)
        assert "Added request" not in log.read_text(errors="replace")
        # Each front end sent its warm-up request before the model was ready (core/warm_up.py), and the counters
        # below count the clients' requests alone
        assert log.read_text(errors="replace").count("vllm_core: warmed up in") == FRONT_ENDS
        served = {int(m[2]) for m in _STATS.finditer(log.read_text(errors="replace")) if int(m[1]) > 0}
        assert served == set(range(FRONT_ENDS)), f"front ends that took requests: {served}"
        # Each front end counts the engine steps whose statistics vLLM handed it, untimed; together they count
        # every step's tokens once (core/step_stats.py)
        steps = combine([snap for line in log.read_text(errors="replace").splitlines() if (snap := parse_line(line))])
        assert steps is not None and not steps.timed and steps.steps_per_second is None
        assert steps.generation_tokens == GREEDY["max_tokens"] * (len(prompts) + 3)
        assert 1 <= steps.prefill_steps < steps.detailed_steps <= steps.steps

        # Both front ends publish into one series per metric (published every 0.2 s; slept above)
        samples = scrape(server)
        finished = [v for (name, _), v in samples.items() if name == "vllm:request_success_total"]
        assert finished == [len(prompts) + 3], f"one series counting every request once: {finished}"
        generated = [v for (name, _), v in samples.items() if name == "vllm:generation_tokens_total"]
        assert generated == [GREEDY["max_tokens"] * (len(prompts) + 3)]
        assert _running(server) == [0.0], "idle: the newest gauge, whichever front end set it"
        # The gauges are the EngineCore's: set while requests run (vLLM hands them to one front end per step). The
        # EngineCore is stopped as the first streamed token arrives, so the running gauge holds while this thread
        # polls it, however late it wakes (tests/support/reliability_helpers.py: engine_stopped)
        long = {"temperature": 0, "max_tokens": 200, "ignore_eos": True}
        threads = [threading.Thread(target=client.infer, args=(PLAIN_MODEL, grpc_inputs(p, long))) for p in prompts[:5]]
        first_token, stream_done = threading.Event(), threading.Event()

        def on_response(result, error) -> None:
            if not first_token.is_set():
                os.kill(engines[0], signal.SIGSTOP)
                first_token.set()
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                stream_done.set()

        for thread in threads:
            thread.start()
        streamer = grpcclient.InferenceServerClient(server.grpc_url)
        streamer.start_stream(callback=on_response)
        streamer.async_stream_infer(STREAM_MODEL, grpc_inputs(prompts[5], long, stream=True))
        try:
            assert first_token.wait(60), "no streamed token in 60 s"
            seen, deadline = [0.0], time.monotonic() + 10
            while max(seen) == 0.0 and time.monotonic() < deadline:
                seen = _running(server)
                time.sleep(0.1)
        finally:
            os.kill(engines[0], signal.SIGCONT)
        assert stream_done.wait(180), "the stream did not end"
        streamer.stop_stream()
        streamer.close()
        for thread in threads:
            thread.join(timeout=180)
        assert max(seen) > 0, "the running gauge never moved while 6 requests ran"
        time.sleep(1.0)
        assert _running(server) == [0.0], "idle again: no older value from another front end left behind"

        _, failed = _kill_in_flight(server, client, engines[0])
        print(f"\n{len(failed)} in flight failed, the last {max(after for _, after in failed):.2f} s after the kill")
        for _ in range(2 * FRONT_ENDS):  # new requests, whichever instance takes them
            start = time.monotonic()
            with pytest.raises(InferenceServerException) as error:
                client.infer(PLAIN_MODEL, grpc_inputs("hello", {"max_tokens": 4}), client_timeout=120)
            assert error.value.status() == "StatusCode.UNAVAILABLE", error.value
            assert time.monotonic() - start < QUICK_SECONDS
        assert server.process.poll() is None, "the server itself must survive"
        client.close()
    finally:
        server.stop()


# The streaming ensemble beside the plain-core model: preprocess model -> core (postprocess in the core's sender: the
# GPU benchmark deployment's arrangement), or the core alone (the preprocess stage on the core's threads too).
STREAMING_CORES = {
    "preprocess-model": {"postprocess_in_sender": True},
    "core-alone": {"postprocess_in_sender": True, "preprocess_threads": 2},
}


@pytest.mark.parametrize("streaming", sorted(STREAMING_CORES))
def test_plain_core_serves_plain_requests_as_front_ends_of_the_cores_engine(tiny_model, tmp_path, streaming):
    """entry: plain-core: the plain public model is the core's adapter (not decoupled), its two instances front ends
    2 and 3 of the engine that the core's instance 0 launched. Plain gRPC, HTTP /infer and /generate are answered
    by it (the same greedy text as the streaming ensemble through the core), a bad parameter is INVALID_ARG naming
    it, a client cannot use the BLS callers' control parameters, and the engine's metrics count every request in
    the core's one series. The streaming ensemble runs the postprocess stage in the core's sender threads, and with
    core.preprocess_threads the preprocess stage on the core's threads as well (the ensemble is then the core alone):
    a bad parameter on a stream is refused by whichever runs it."""
    import requests
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    repository = render_repository(
        tmp_path / "repository",
        entry="plain-core",
        core={"front_ends": FRONT_ENDS, **STREAMING_CORES[streaming]},
        generate={"instances": 2, "preprocess_threads": 2},
        health={"restart_engine": False},
        metrics=True,
        engine_env={"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    config = (repository / PLAIN_MODEL / "config.pbtxt").read_text()
    assert 'backend: "python"' in config and "decoupled" not in config
    assert not (repository / "generate").exists()
    streaming_steps = (repository / STREAM_MODEL / "config.pbtxt").read_text().count("step {")
    assert streaming_steps == (1 if streaming == "core-alone" else 2)
    assert not (repository / "postprocess").exists()  # the core's sender threads run it
    assert (repository / "preprocess").exists() == (streaming == "preprocess-model")
    log = tmp_path / "tritonserver.log"
    server = start_on_free_ports(repository, log, environment={CORE_STATS_KEY: "1"})
    try:
        engines = engine_cores(server)
        assert len(engines) == 1, f"one EngineCore for {FRONT_ENDS} + 2 front ends, found {engines}"
        client = grpcclient.InferenceServerClient(server.grpc_url)
        prompts = [f"Story {i}: once upon a time" for i in range(16)]
        plain = _ask_all(client, prompts)
        prompt = prompts[0]
        deltas = grpc_stream(server.grpc_url, grpc_inputs(prompt, GREEDY, stream=True))
        streamed = "".join(d["text_output"][0].decode() for d, _ in deltas)
        assert prompt + streamed == plain[prompt], (streamed, plain[prompt])
        with pytest.raises(InferenceServerException, match="temperature"):
            grpc_stream(server.grpc_url, grpc_inputs(prompt, {"temperature": -1}, stream=True))
        # `stream` asked of the plain model: one response all the same, the prompt not echoed (the backend's rule)
        one = client.infer(PLAIN_MODEL, grpc_inputs(prompt, GREEDY, stream=True), client_timeout=120)
        assert one.as_numpy("text_output")[0].decode() == streamed
        # the core's control parameters are not a client's: this request is answered, not aborted
        controlled = client.infer(
            PLAIN_MODEL, grpc_inputs(prompt, GREEDY), parameters={"abort": "x", "cancel_key": "y"}, client_timeout=120
        )
        assert controlled.as_numpy("text_output")[0].decode() == plain[prompt]
        with pytest.raises(InferenceServerException) as error:
            client.infer(PLAIN_MODEL, grpc_inputs(prompt, {"temperature": -1}), client_timeout=120)
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT" and "temperature" in str(error.value)
        http = f"http://{server.address}:{server.http_port}/v2/models/{PLAIN_MODEL}"
        infer = {
            "inputs": [
                {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": [prompt]},
                {"name": "sampling_parameters", "shape": [1], "datatype": "BYTES", "data": [json.dumps(GREEDY)]},
            ]
        }
        # Connection: close, or a kept-alive connection (requests left one open here, its session closed or not)
        # holds tritonserver's stop for its whole exit timeout
        once = {"Connection": "close"}
        generate = {"text_input": prompt, "parameters": GREEDY}
        reply = requests.post(f"{http}/generate", json=generate, headers=once, timeout=120)
        assert reply.status_code == 200 and reply.json()["text_output"] == plain[prompt], reply.text
        reply = requests.post(f"{http}/infer", json=infer, headers=once, timeout=120)
        assert reply.status_code == 200, reply.text
        assert [o["data"][0] for o in reply.json()["outputs"] if o["name"] == "text_output"] == [plain[prompt]]
        client.close()

        time.sleep(2.5)  # the counters' log line every second; the metrics published every 0.2 s
        served = {int(m[2]) for m in _STATS.finditer(log.read_text(errors="replace")) if int(m[1]) > 0}
        assert served >= {FRONT_ENDS, FRONT_ENDS + 1}, f"the plain model's front ends took no requests: {served}"
        assert {int(m[3]) for m in _STATS.finditer(log.read_text(errors="replace"))} == {FRONT_ENDS + 2}
        finished = {labels: v for (name, labels), v in scrape(server).items() if name == "vllm:request_success_total"}
        assert list(finished.values()) == [len(prompts) + 5], finished  # +1 streamed, 4 more plain (1 refused)
        assert ("model", "vllm_core") in next(iter(finished))
    finally:
        code = server.stop()
    # the core's instance 0 ended the engine; the plain front ends saw the server stopping, not a failure
    assert code == 0, "a clean stop"
    assert "output_handler failed" not in log.read_text(errors="replace")


def test_a_clean_stop_ends_the_shared_engine_without_an_error_in_the_other_front_ends(tiny_model, tmp_path):
    """At a stop, front end 0 ends the shared engine and the other front ends see it end: the server stopping, not
    their failure. Before, each of them logged vLLM's `AsyncLLM output_handler failed` with a traceback at every
    stop (three in every benchmark command on the H100)."""
    import tritonclient.grpc as grpcclient

    repository = render_repository(
        tmp_path / "repository",
        entry="ensemble",
        core={"front_ends": FRONT_ENDS},
        health={"restart_engine": False},
        engine_env={"OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    log = tmp_path / "tritonserver.log"
    server = start_on_free_ports(repository, log)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for _ in range(2 * FRONT_ENDS):
            client.infer(PLAIN_MODEL, grpc_inputs("hello", GREEDY), client_timeout=120)
        client.close()
    finally:
        code = server.stop()
    text = log.read_text(errors="replace")
    assert code == 0, "a clean stop"
    assert "the shared vLLM engine was stopped by front end 0" in text, "front end 1 saw the engine end"
    assert "output_handler failed" not in text
    assert "EngineDeadError" not in text
    # nor at the stubs' exit: each front end let its vLLM client go first (docs/platform-notes.md E4)
    assert "AsyncLLM.__del__" not in text
