"""The benchmark's clients: how each served path is called, and how a level's streams are run, in this process or
spread over several client processes.

One Python process driving 256 gRPC streams is itself busy: on the H100 the single client used 0.6 of a core on
average at 256 streams (tokens/s of ~16k, ~2k responses/s), and an asyncio loop that is that busy delays the
responses it reads, most of all at the bursts where a wave of requests starts. `--client-processes K` spreads a
level's streams over K processes with their own event loop and connection, each running its share of the
concurrency and of the requests; the level's wall time is from the first process's start to the last one's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import itertools
import json
import multiprocessing
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.engine_lags import EngineLags, LagSnapshot, combine

# `vllm serve` closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default); aiohttp keeps idle ones
# 15 s, so after a long concurrency-1 level the next level reused connections the server was closing (measured on
# the H100: "Server disconnected" at 256 tokens x 16). Drop them first.
SERVE_CLIENT_KEEPALIVE_S = 2.0
SERVE_MODEL_NAME = "bench"  # the name `vllm serve` is started with (--served-model-name)


@dataclass
class Sample:
    latency: float
    ttft: float | None
    output_tokens: int
    # the wave it went out in: request i of a level's N streams (of one client process's share) is sent when a
    # stream is free, in order, so in wave i // N (tools/wave_latencies.py reads a level wave by wave)
    wave: int = 0


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str  # the same prompt decoded: what the Triton paths send as text_input


@dataclass(frozen=True)
class ClientSpec:
    """What a client needs to call one path; plain data, so a client process can be given it."""

    kind: str  # one of CLIENT_KINDS
    address: str  # host:port of the server's gRPC or HTTP endpoint; the engine front ends' spec file (below)
    model: str
    index: int = 0  # this client process's place in its pool (an engine front end's index among the front ends)


Send = Callable[[Prompt, int], Awaitable[Sample]]


# Clients of the Triton paths ------------------------------------------------------------------------------


def _sampling(max_tokens: int) -> dict[str, Any]:
    """Every path's sampling: greedy, and exactly max_tokens tokens (ignore_eos)."""
    return {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}


def _generate_payload(prompt: Prompt, max_tokens: int, count: bool = False) -> dict[str, Any]:
    """Triton's HTTP /generate body; `count` asks for num_output_tokens (the token check)."""
    payload = {"text_input": prompt.text, "exclude_input_in_output": True, "parameters": _sampling(max_tokens)}
    return {**payload, "return_num_output_tokens": True} if count else payload


def _completions_payload(model: str, prompt: Prompt, max_tokens: int, stream: bool) -> dict[str, Any]:
    """`vllm serve`'s /v1/completions body, with the prompt's token ids."""
    return {"model": model, "prompt": prompt.ids, **_sampling(max_tokens), "stream": stream}


def _input_arrays(text: str, max_tokens: int, stream: bool, count: bool = False) -> list[tuple[str, Any, str]]:
    """The vLLM backend's input tensors; `count` asks for num_output_tokens too (the token check, not a measured
    request: it adds an output to every response)."""
    import numpy as np

    sampling = json.dumps(_sampling(max_tokens))
    arrays = [
        ("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"),
        ("sampling_parameters", np.array([sampling.encode()], dtype=np.object_), "BYTES"),
        ("stream", np.array([stream]), "BOOL"),
        ("exclude_input_in_output", np.array([True]), "BOOL"),
    ]
    if count:
        arrays.append(("return_num_output_tokens", np.array([True]), "BOOL"))
    return arrays


def _triton_inputs(module: Any, text: str, max_tokens: int, stream: bool, count: bool = False) -> list[Any]:
    inputs = []
    for name, array, dtype in _input_arrays(text, max_tokens, stream, count):
        tensor = module.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _stream_request(model: str, text: str, max_tokens: int) -> Any:
    """A ModelInferRequest for a long-lived stream, asking for the empty final response that marks its end.

    tritonclient's asyncio client has no way to ask for it (the parameter is reserved, and only its threaded client
    sets it), so the request is built from Triton's public protobuf messages.
    """
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array, dtype in _input_arrays(text, max_tokens, True):
        request.inputs.add(name=name, datatype=dtype, shape=list(array.shape))
        content = serialize_byte_tensor(array).item() if dtype == "BYTES" else array.tobytes()
        request.raw_input_contents.append(content)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


class _LongLivedStream:
    """One gRPC bidirectional stream that carries one request after another, as perf_analyzer's and the vLLM
    backend's own streaming clients do: a request goes in, its responses are read up to the final one."""

    def __init__(self, stub: Any) -> None:
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        self._call = stub.ModelStreamInfer(self._feed())

    async def _feed(self) -> Any:
        while (request := await self._requests.get()) is not None:
            yield request

    async def run(self, request: Any, start: float) -> float | None:
        """Send `request` and read its responses; returns the time to its first output from `start`."""
        import grpc

        self._requests.put_nowait(request)
        ttft = None
        while True:
            message = await self._call.read()
            if message is grpc.aio.EOF:
                raise RuntimeError("the server ended the stream before the request's final response")
            if message.error_message:
                raise RuntimeError(message.error_message)
            response = message.infer_response
            if ttft is None and response.outputs:
                ttft = time.perf_counter() - start
            if response.parameters["triton_final_response"].bool_param:
                return ttft

    def close(self) -> None:
        self._requests.put_nowait(None)  # ends the request feed (a half-close)
        self._call.cancel()  # and the call itself, whatever the server still had to send


class StreamPool:
    """Streams that outlive their requests: a request takes an idle stream (or opens one) and gives it back after its
    final response, so a level of N concurrent requests keeps N streams open over all its requests."""

    def __init__(self, spec: ClientSpec) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.model = spec.model
        self._channel = grpc.aio.insecure_channel(spec.address)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._idle: list[_LongLivedStream] = []
        self.opened: list[_LongLivedStream] = []

    async def send(self, prompt: Prompt, max_tokens: int) -> Sample:
        request = _stream_request(self.model, prompt.text, max_tokens)
        if self._idle:
            stream = self._idle.pop()
        else:
            stream = _LongLivedStream(self._stub)
            self.opened.append(stream)
        start = time.perf_counter()
        try:
            ttft = await stream.run(request, start)
        except BaseException:
            stream.close()  # its state is unknown after an error: never reused
            raise
        self._idle.append(stream)
        return Sample(time.perf_counter() - start, ttft, max_tokens)

    async def close(self) -> None:
        for stream in self.opened:
            stream.close()
        await self._channel.close()


async def _grpc_client(spec: ClientSpec, stream: bool) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import tritonclient.grpc.aio as grpc_aio

    client = grpc_aio.InferenceServerClient(spec.address)

    async def infer(prompt: Prompt, max_tokens: int) -> Sample:
        inputs = _triton_inputs(grpc_aio, prompt.text, max_tokens, False)
        start = time.perf_counter()
        await client.infer(spec.model, inputs)
        return Sample(time.perf_counter() - start, None, max_tokens)

    async def streamed(prompt: Prompt, max_tokens: int) -> Sample:
        """One gRPC bidirectional stream per request, half-closed after the request (as stop_stream() does)."""
        inputs = _triton_inputs(grpc_aio, prompt.text, max_tokens, True)

        async def requests():
            yield {"model_name": spec.model, "inputs": inputs, "request_id": "b"}

        start = time.perf_counter()
        ttft = None
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            response = result.get_response()
            if ttft is None and response.outputs:
                ttft = time.perf_counter() - start
            if response.parameters["triton_final_response"].bool_param:
                break
        return Sample(time.perf_counter() - start, ttft, max_tokens)

    return (streamed if stream else infer), client.close


async def _http_client(spec: ClientSpec, kind: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    keepalive = SERVE_CLIENT_KEEPALIVE_S if kind.startswith("openai") else 15.0
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive))

    async def generate(prompt: Prompt, max_tokens: int) -> Sample:
        """Triton's HTTP /generate."""
        payload = _generate_payload(prompt, max_tokens)
        start = time.perf_counter()
        async with session.post(f"http://{spec.address}/v2/models/{spec.model}/generate", json=payload) as r:
            body = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {body[:200]!r}")
        return Sample(time.perf_counter() - start, None, max_tokens)

    async def completions(prompt: Prompt, max_tokens: int) -> Sample:
        """`vllm serve`'s /v1/completions, with the prompt's token ids."""
        stream = kind == "openai-stream"
        payload = _completions_payload(spec.model, prompt, max_tokens, stream)
        start = time.perf_counter()
        ttft = None
        async with session.post(f"http://{spec.address}/v1/completions", json=payload) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.read())[:200]!r}")
            if stream:
                async for line in r.content:
                    if ttft is None and line.startswith(b"data: ") and b'"text"' in line:
                        ttft = time.perf_counter() - start
            else:
                await r.read()
        return Sample(time.perf_counter() - start, ttft, max_tokens)

    return (generate if kind == "http-generate" else completions), session.close


# Clients of a vLLM engine in this process -----------------------------------------------------------------


def engine_sender(llm: Any, stream: bool, prefix: str, on_output: Callable[..., None] | None = None) -> Send:
    """The send function of an in-process vLLM AsyncLLM: FINAL_ONLY outputs, or DELTA ones when `stream` (which
    gives TTFT). `on_output(output, submitted, first)` sees every output (the bare worker's --profile lags)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
    counter = itertools.count()

    async def send(prompt: Prompt, max_tokens: int) -> Sample:
        params = SamplingParams(**_sampling(max_tokens), output_kind=kind)
        start, submitted = time.perf_counter(), time.monotonic()
        ttft, tokens = None, 0
        async for output in llm.generate({"prompt_token_ids": prompt.ids}, params, f"{prefix}-{next(counter)}"):
            if on_output is not None:
                on_output(output, submitted, ttft is None)
            if ttft is None:
                ttft = time.perf_counter() - start
            tokens += len(output.outputs[0].token_ids)  # a DELTA output's new tokens; the FINAL_ONLY one's all
        return Sample(time.perf_counter() - start, ttft if stream else None, tokens)

    return send


def delayed(send: Send, max_delay: float, seed: int = 0) -> Send:
    """`send` with each request held back a random 0-`max_delay` seconds (uniform) before it goes out, the hold
    counted in its latency (the bare-delayed path): requests that reach the engine spread out as a wave's do through a
    server's hops, without the server. Seeded: the same holds in every run."""
    rng = random.Random(seed)

    async def send_later(prompt: Prompt, max_tokens: int) -> Sample:
        start = time.perf_counter()
        await asyncio.sleep(rng.uniform(0.0, max_delay))
        held = time.perf_counter() - start
        sample = await send(prompt, max_tokens)
        ttft = None if sample.ttft is None else held + sample.ttft
        return replace(sample, latency=held + sample.latency, ttft=ttft)

    return send_later


@functools.cache
def _front_ends_spec(spec_file: str) -> dict[str, Any]:
    """The front-ends launcher's spec (tools/bench.py's FrontEndsGroup), read once per client process."""
    return json.loads(Path(spec_file).read_text(encoding="utf-8"))


@functools.cache
def _attached_front_end(spec_file: str, index: int) -> Any:
    """This process's AsyncLLM, attached as front end `index` to the EngineCore that tools/bench.py's front-ends
    launcher started (as the core's front ends attach to the one their instance 0 launches: core/front_ends.py).
    Both client kinds of a process share it, as both of a core instance's ensembles share its front end."""
    from core import front_ends
    from core.engine import prepare_process_environment
    from core.gc_heap import freeze_startup_heap
    from core.metrics import quiet_iteration_log

    prepare_process_environment()
    quiet_iteration_log()  # under --profile vLLM's statistics are on: no log line per iteration
    spec = _front_ends_spec(spec_file)
    fe = front_ends.FrontEnd(index, spec["front_ends"], Path(spec["socket_dir"]))
    config, executor = front_ends.vllm_config(spec["engine_args"])
    llm = front_ends.attach_client(config, executor, fe, None, spec["engine_args"])
    freeze_startup_heap(switchable=False)  # as the bare worker and `vllm serve` freeze theirs
    return llm


# engine-front-end(-stream): an AsyncLLM front end of the benchmark's shared EngineCore, in this process
FRONT_END_KINDS = ("engine-front-end", "engine-front-end-stream")


@functools.cache
def _front_end_lags(spec_file: str, index: int) -> EngineLags | None:
    """This process's front end's trips to and from the EngineCore, for both client kinds, under --profile only
    (vLLM's statistics on, as for the bare engine's client): otherwise no counting call per output."""
    return EngineLags() if _front_ends_spec(spec_file).get("profile") else None


def front_end_lags(spec: ClientSpec) -> EngineLags | None:
    """The EngineLags of a client process whose client is a profiled engine front end; None otherwise."""
    if spec.kind not in FRONT_END_KINDS:
        return None
    return _front_end_lags(spec.address, spec.index)


def counting(lags: EngineLags) -> Callable[[Any, float, bool], None]:
    """engine_sender's `on_output` that counts each output's trips to and from the EngineCore in `lags`."""

    def count(output: Any, submitted: float, first: bool) -> None:
        lags.output(output.metrics, submitted, first, output.finished)

    return count


async def _engine_front_end_client(spec: ClientSpec, stream: bool) -> tuple[Send, Callable[[], Awaitable[None]]]:
    llm = _attached_front_end(spec.address, spec.index)

    async def close() -> None:  # the process's front end serves its other kind too; it ends with the process
        pass

    lags = front_end_lags(spec)
    return engine_sender(llm, stream, f"fe{spec.index}", None if lags is None else counting(lags)), close


# grpc-stream: a stream per concurrent slot, reused by its requests; grpc-stream-per-request: a new stream each
CLIENT_KINDS = (
    "grpc-infer",
    "grpc-stream",
    "grpc-stream-per-request",
    "http-generate",
    "openai",
    "openai-stream",
    *FRONT_END_KINDS,
)


async def open_client(spec: ClientSpec) -> tuple[Send, Callable[[], Awaitable[None]]]:
    """The send function of a path's client, and how to close it."""
    if spec.kind == "grpc-stream":
        pool = StreamPool(spec)
        return pool.send, pool.close
    if spec.kind in ("grpc-infer", "grpc-stream-per-request"):
        return await _grpc_client(spec, spec.kind == "grpc-stream-per-request")
    if spec.kind in ("http-generate", "openai", "openai-stream"):
        return await _http_client(spec, spec.kind)
    if spec.kind in FRONT_END_KINDS:
        return await _engine_front_end_client(spec, spec.kind == "engine-front-end-stream")
    raise ValueError(f"unknown client kind {spec.kind!r}; one of {', '.join(CLIENT_KINDS)}")


# The token check -------------------------------------------------------------------------------------------
# A served path's Sample takes max_tokens on trust (counting every measured request would add work to it: an output
# tensor per response, a usage chunk per stream). So before measuring, the benchmark asks each served path once per
# prompt and max_tokens, with its server counting: a path that stopped early would otherwise look faster.


async def generated_tokens(spec: ClientSpec, prompts: list[Prompt], max_tokens: int, concurrency: int) -> list[int]:
    """The output tokens a served path (`spec`) generates for each prompt with the benchmark's sampling, as its server
    counts them (num_output_tokens; `vllm serve`'s usage, asked without streaming), at most `concurrency` at once
    (the run's largest level: the engine's batch never exceeds what the run measures). The engine's own clients
    (engine_sender) count every measured request instead."""
    if spec.kind in ("openai", "openai-stream"):
        return await _counted_completions(spec, prompts, max_tokens, concurrency)
    if spec.kind == "http-generate":
        return await _counted_generates(spec, prompts, max_tokens, concurrency)
    if spec.kind.startswith("grpc-"):
        return await _counted_triton(spec, prompts, max_tokens, concurrency)
    raise ValueError(f"no server counts the tokens of client kind {spec.kind!r}")


async def _each_prompt(count: Callable[[Prompt], Awaitable[int]], prompts: list[Prompt], concurrency: int) -> list[int]:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: Prompt) -> int:
        async with gate:
            return await count(prompt)

    return list(await asyncio.gather(*(one(prompt) for prompt in prompts)))


async def _counted_triton(spec: ClientSpec, prompts: list[Prompt], max_tokens: int, concurrency: int) -> list[int]:
    import tritonclient.grpc.aio as grpc_aio

    stream = spec.kind != "grpc-infer"
    client = grpc_aio.InferenceServerClient(spec.address)

    async def count(prompt: Prompt) -> int:
        inputs = _triton_inputs(grpc_aio, prompt.text, max_tokens, stream, count=True)
        if not stream:
            return int((await client.infer(spec.model, inputs)).as_numpy("num_output_tokens").sum())

        async def requests():
            yield {"model_name": spec.model, "inputs": inputs}

        tokens = 0
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            counted = result.as_numpy("num_output_tokens")
            tokens += 0 if counted is None else int(counted.sum())  # each response's own new tokens
            if result.get_response().parameters["triton_final_response"].bool_param:
                return tokens
        raise RuntimeError("the server ended the stream before the request's final response")

    try:
        return await _each_prompt(count, prompts, concurrency)
    finally:
        await client.close()


async def _counted_generates(spec: ClientSpec, prompts: list[Prompt], max_tokens: int, concurrency: int) -> list[int]:
    import aiohttp

    async with aiohttp.ClientSession() as session:

        async def count(prompt: Prompt) -> int:
            payload = _generate_payload(prompt, max_tokens, count=True)
            async with session.post(f"http://{spec.address}/v2/models/{spec.model}/generate", json=payload) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {body}")
            counted = body["num_output_tokens"]  # a one-element output: a number, or a list of one
            return int(sum(counted) if isinstance(counted, list) else counted)

        return await _each_prompt(count, prompts, concurrency)


async def _counted_completions(spec: ClientSpec, prompts: list[Prompt], max_tokens: int, concurrency: int) -> list[int]:
    import aiohttp

    async with aiohttp.ClientSession() as session:

        async def count(prompt: Prompt) -> int:
            payload = _completions_payload(spec.model, prompt, max_tokens, stream=False)
            async with session.post(f"http://{spec.address}/v1/completions", json=payload) as r:
                body = await r.json(content_type=None)
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {body}")
            return int(body["usage"]["completion_tokens"])

        return await _each_prompt(count, prompts, concurrency)


# Running a level --------------------------------------------------------------------------------------------


async def run_level(
    send: Send,
    prompts: list[Prompt],
    concurrency: int,
    total: int,
    max_tokens: int,
    progress: Any = None,
    stagger: float = 0.0,
    phase: float = 0.0,
) -> tuple[list[Sample], float]:
    """Run `total` requests with at most `concurrency` in flight; returns the samples and the wall time.

    `stagger` (seconds): the streams' first requests start evenly spread over it instead of all at once, so the
    streams run out of step (steady-state arrivals) rather than in waves that start and finish together. Stream i
    starts after (i + phase) / concurrency of it: K client processes sharing a level use phases 0, 1/K, ... so that
    their streams interleave."""
    gate = asyncio.Semaphore(concurrency)
    samples: list[Sample] = []

    async def one(i: int) -> None:
        async with gate:
            if stagger and i < concurrency:  # holding its slot: a later request must not start the stream early
                await asyncio.sleep(stagger * (i + phase) / concurrency)
            sample = await send(prompts[i % len(prompts)], max_tokens)
            samples.append(replace(sample, wave=i // concurrency))
            if progress is not None:
                progress.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(total)))
    return samples, time.perf_counter() - start


def warm_up_requests(concurrency: int) -> int:
    """The uncounted round before each level: up to 16 requests at the level's concurrency."""
    return min(concurrency, 16)


async def warm_up(send: Send, prompts: list[Prompt], concurrency: int, max_tokens: int, warm: bool) -> None:
    """The level's uncounted warm-up round (warm_up_requests), unless the path is `warm` already."""
    if not warm:
        await run_level(send, prompts, concurrency, warm_up_requests(concurrency), max_tokens)


@dataclass
class LevelRun:
    samples: list[Sample]
    wall: float
    client_cpu_seconds: float
    # the engine front ends' trips to and from the EngineCore over the level (core/engine_lags.py), where the client
    # processes are front ends with vLLM's statistics on (--profile); None otherwise
    engine_lags: dict[str, Any] | None = None


class InProcessRunner:
    """A level's streams on this process's event loop (the bare engine's own client is always this)."""

    def __init__(self, send: Send, close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.send = send
        self._close = close

    async def prepare(
        self,
        prompts: list[Prompt],
        concurrency: int,
        total: int,
        max_tokens: int,
        stagger: float = 0.0,
        warm: bool = False,
    ) -> None:
        """The level's uncounted warm-up round (none if the path is `warm` already)."""
        self._level = (prompts, concurrency, total, max_tokens)
        self._stagger = stagger
        await warm_up(self.send, prompts, concurrency, max_tokens, warm)

    async def run(self, progress: Any = None) -> LevelRun:
        cpu = time.process_time()
        samples, wall = await run_level(self.send, *self._level, progress, self._stagger)
        return LevelRun(samples, wall, time.process_time() - cpu)

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


def split(count: int, parts: int) -> list[int]:
    """`count` spread over `parts` as evenly as possible (the first ones get the remainder)."""
    return [count // parts + (1 if i < count % parts else 0) for i in range(parts)]


def slice_shares(requests: int, concurrency: int, slices: int) -> list[int]:
    """A level's requests as the slices it is measured in (tools/bench.py level_slices): at one stream shared
    out; with several, whole waves each (any requests beyond whole waves with the last). One share: measured whole."""
    if slices <= 1:
        return [requests]
    if concurrency == 1:
        shares = [share for share in split(requests, slices) if share]
    else:
        whole_waves, rest = divmod(requests, concurrency)
        shares = [count * concurrency for count in split(whole_waves, slices) if count]
        if shares:
            shares[-1] += rest
    return shares if len(shares) > 1 else [requests]


def _client_process(spec: ClientSpec, connection: Any) -> None:
    asyncio.run(_serve_levels(spec, connection))


async def _serve_levels(spec: ClientSpec, connection: Any) -> None:
    """A client process: for each level, warm up, say ready, wait for "go", run its share, report. Each level names
    the client kind it is run with (a pool may serve several paths: ProcessPoolRunner.as_kind); a kind's client
    opens at its first level."""
    clients: dict[str, tuple[Send, Callable[[], Awaitable[None]]]] = {}
    loop = asyncio.get_running_loop()
    try:
        while True:
            command = await loop.run_in_executor(None, connection.recv)
            if command is None:
                return
            kind, prompts, concurrency, total, max_tokens, stagger, phase, warm = command
            try:
                if kind not in clients:
                    clients[kind] = await open_client(replace(spec, kind=kind))
                send = clients[kind][0]
                await warm_up(send, prompts, concurrency, max_tokens, warm)
                lags = front_end_lags(replace(spec, kind=kind))
                connection.send("ready")
                if await loop.run_in_executor(None, connection.recv) is None:  # "go" (all start together)
                    return  # closed instead: another process's warm-up failed
                if lags is not None:
                    lags.snapshot()  # the level's count starts here: not the warm-up's
                cpu, start = time.process_time(), time.perf_counter()
                samples, _ = await run_level(
                    send, prompts, concurrency, total, max_tokens, stagger=stagger, phase=phase
                )
                ended, used = time.perf_counter(), time.process_time() - cpu
                counted = None if lags is None else lags.snapshot().as_dict()
                connection.send((start, ended, samples, used, counted))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
                connection.send(RuntimeError(f"client process: {type(exc).__name__}: {exc}"))
    finally:
        for _, close in clients.values():
            await close()


class ProcessPoolRunner:
    """A level's streams spread over up to `processes` client processes (never more than the concurrency).

    The processes start once and serve every level of the path; time.perf_counter is the system's monotonic
    clock on Linux, so their start and end times compare across processes. Process i gets the spec with index i.
    """

    def __init__(self, spec: ClientSpec, processes: int) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of this process's threads and event loop
        self.kind = spec.kind
        self._connections: list[Any] = []
        self._processes: list[Any] = []
        for index in range(processes):
            parent, child = context.Pipe()
            process = context.Process(target=_client_process, args=(replace(spec, index=index), child), daemon=True)
            process.start()
            self._connections.append(parent)
            self._processes.append(process)
        self._busy: list[Any] = []
        self._total = 0

    def as_kind(self, kind: str) -> ProcessPoolRunner:
        """The same processes, running levels with another client kind (one pool for several paths: the engine
        front ends serve both the plain and the streamed path). Close the pool itself, not a view."""
        view = copy.copy(self)
        view.kind = kind
        return view

    async def _receive(self, connection: Any) -> Any:
        reply = await asyncio.get_running_loop().run_in_executor(None, connection.recv)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def prepare(
        self,
        prompts: list[Prompt],
        concurrency: int,
        total: int,
        max_tokens: int,
        stagger: float = 0.0,
        warm: bool = False,
    ) -> None:
        """Give each process its share of the level; each warms up with it (unless the path is `warm` already).
        Returns when all are ready.

        Each process staggers its own streams over `stagger`, each at its own phase: together they start evenly
        spread over it."""
        self._busy = self._connections[: min(len(self._connections), concurrency)]
        self._total = total
        shares = zip(self._busy, split(concurrency, len(self._busy)), split(total, len(self._busy)), strict=True)
        for index, (connection, streams, requests) in enumerate(shares):
            phase = index / len(self._busy)
            connection.send((self.kind, prompts, streams, requests, max_tokens, stagger, phase, warm))
        await asyncio.gather(*(self._receive(connection) for connection in self._busy))

    async def run(self, progress: Any = None) -> LevelRun:
        for connection in self._busy:
            connection.send("go")
        replies = await asyncio.gather(*(self._receive(connection) for connection in self._busy))
        if progress is not None:
            progress.update(self._total)
        samples = [sample for reply in replies for sample in reply[2]]
        wall = max(reply[1] for reply in replies) - min(reply[0] for reply in replies)
        lags = combine([LagSnapshot(**reply[4]) for reply in replies if reply[4] is not None])
        return LevelRun(samples, wall, sum(reply[3] for reply in replies), None if lags is None else lags.as_dict())

    async def close(self) -> None:
        for connection in self._connections:
            # A process that is gone already (`timeout` signals the whole process group, these included) is not told
            with contextlib.suppress(OSError):
                connection.send(None)
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


Runner = InProcessRunner | ProcessPoolRunner


async def open_runner(spec: ClientSpec, processes: int) -> Runner:
    """The runner of one path: its client in this process (processes 1), or a pool of client processes."""
    if processes > 1:
        return ProcessPoolRunner(spec, processes)
    return InProcessRunner(*await open_client(spec))
