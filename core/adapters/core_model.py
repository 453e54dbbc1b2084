"""The Triton adapter of the vLLM core: decoupled, owns the engine, sends from sender threads. With entry:
plain-core the plain public model runs it too: not decoupled, more front ends of the same engine."""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import triton_python_backend_utils as pb_utils

from core.adapters.common import (
    ABORT_PARAMETER,
    CANCEL_KEY_PARAMETER,
    CODE_TAG_PARAMETER,
    LORA_FILE,
    GuardedSender,
    LoadedStage,
    document_tensor,
    lora_adapters,
    request_parameters,
    triton_error,
    version_dir,
)
from core.adapters.metrics_publisher import TritonMetrics
from core.coalesce import Outgoing, StreamPacer
from core.core_stats import CoreStats
from core.cpu_placement import EnginePlacement
from core.engine import Engine, prepare_process_environment
from core.engine_config import ENGINE_ARGS_FILE, load_engine_args
from core.engine_hold_install import install as hold_outputs_in_engine
from core.engine_lags import EngineLags
from core.front_ends import front_end
from core.gc_heap import freeze_startup_heap
from core.interface import ENGINE_REQUEST, ENGINE_RESPONSE, InvalidInput, Unavailable
from core.interface import document_tensor as document_array
from core.metrics import GaugeClock, StatsSink, profiled_engine_args, stat_logger_factory
from core.protocol import EngineRequest, EngineResponse, decode_request, encode_response, error_response
from core.settings import STAGES_FILE, CoreModelSettings, load_settings
from core.step_stats import EngineSteps
from core.warm_up import STATS_SECONDS, FinishWatch, warm_up

# What a BLS caller of the core (an entry model, generate) may ask of it besides the engine request
CONTROL_PARAMETERS = frozenset((ABORT_PARAMETER, CANCEL_KEY_PARAMETER, CODE_TAG_PARAMETER))


def _emitter(outbox: queue.SimpleQueue[Outgoing | None], sender: Any, stats: CoreStats | None):
    def emit(response: EngineResponse | None, error: Exception | None, final: bool) -> None:
        if stats is not None:
            stats.emitted(id(sender))
        outbox.put(Outgoing(sender, response, error, final or error is not None))

    return emit


class CoreSender(GuardedSender):
    """A core request's response sender, with what the core's sender threads need to know about the request."""

    def __init__(self, sender: Any) -> None:
        super().__init__(sender)
        # The request's parameters when the core runs the postprocess stage for it (core.postprocess_in_sender and
        # the caller asked for the stage's outputs); None: it gets ENGINE_RESPONSE.
        self.stage_parameters: dict[str, Any] | None = None
        self.engine_request_id: str | None = None  # the engine's id, once submitted: a failed stage aborts it


class CoreModel:
    """Decoupled: owns the vLLM engine; one response per engine output (one in all when not streaming).

    As the plain public model (entry: plain-core; settings.json `plain`) it is not decoupled: its instances are
    further front ends of the core's engine, each request goes through the preprocess stage on its threads, is
    generated as one FINAL_ONLY output and answered with the postprocess stage's outputs in one response. No
    Python-backend hop lies between the client's request and the engine.
    """

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        model_dir = version_dir(args)
        loras = lora_adapters(model_dir / LORA_FILE, Path(args["model_repository"]).parent)
        settings = load_settings(CoreModelSettings, model_dir)
        self.plain = settings.plain
        self.watch_cancels = settings.watch_cancels
        # The deployment's engine_env, before vLLM reads it; the EngineCore process inherits it.
        os.environ.update(settings.engine_env)
        prepare_process_environment()  # before anything imports vLLM
        engine_args = load_engine_args(model_dir / ENGINE_ARGS_FILE)
        # Whose engine this is: this model's own, or the core's (the plain model of entry: plain-core)
        clients = settings.clients_of(args["model_name"])
        fe = front_end(clients.total, args.get("model_instance_name", ""), clients.engine_model, first=clients.first)
        self._metrics: TritonMetrics | None = None
        sinks: list[StatsSink] = []
        if settings.metrics:
            # The engine's metrics, in its model's series (the plain model of entry: plain-core: the core's)
            labels = {"model": clients.engine_model, "version": args["model_version"]}
            # Several front ends share these metrics (Triton's, by name and labels): gauges newest-first.
            self._metrics = TritonMetrics(labels, None if fe is None else GaugeClock(fe.gauge_clock_path))
            sinks.append(self._metrics.buffer)
        # The opt-in counters (core/core_stats.py) include the engine's steps and trips, which need vLLM's statistics.
        # With several front ends vLLM sends each step's statistics to one of them: each counts its share untimed,
        # and the shares add up (core/step_stats.py).
        profiling = CoreStats.seconds_from_environment() > 0
        steps = EngineSteps(timed=fe is None) if profiling else None
        lags = EngineLags() if profiling else None
        if steps is not None:
            sinks.append(steps)
        # Last: it tells when the warm-up request's statistics have reached the sinks before it (core/warm_up.py)
        finish_watch = FinishWatch() if sinks else None
        if finish_watch is not None:
            sinks.append(finish_watch)
        if profiling:
            engine_args = profiled_engine_args(engine_args)
        # The engine's processes are the children of the front end that launched them.
        places = settings.core.engine_cpus and (fe is None or fe.launches_engine)
        placement = EnginePlacement(settings.core.engine_cpus) if places else None
        if settings.core.hold_outputs_in_engine and not hold_outputs_in_engine():
            self.logger.log_warn(
                "vllm_core: core.hold_outputs_in_engine is off: this vLLM's engine outputs have fields the core does"
                " not know (core/engine_hold.py), so every output is sent as vLLM makes it"
            )
        self.engine = Engine(
            engine_args,
            lora_adapters=loras,
            stat_loggers=[stat_logger_factory(*sinks)] if sinks else None,
            # Triton 2.51's Python backend cannot mark the model not ready: the engine restarts itself instead.
            restart=settings.health,
            on_start=None if placement is None else lambda: self._place(placement),
            lags=lags,
            front_end=fe,
        )
        self.engine.start()
        # Responses are built and sent from sender threads, so the engine's event loop never waits on Triton IPC,
        # and a stream's deltas that queue up meanwhile go out merged (core/coalesce.py). Each send is a blocking
        # round trip to tritonserver with the GIL released (python_backend's ResponseSender::Send): several
        # threads keep several round trips in flight. A request stays on one thread, so its order holds.
        self.stream_interval = settings.stream_interval_ms / 1000
        if settings.core.switch_interval_ms > 0:
            # A thread back from a GIL-free wait (an IPC round trip, a request arriving) waits for the GIL up to
            # the switch interval while the engine loop computes. Set after the engine started: a forked
            # EngineCore would inherit it, and its busy loop must not hand the GIL over that often.
            sys.setswitchinterval(settings.core.switch_interval_ms / 1000)
        # The stages run here for the requests of the streaming ensemble: core.preprocess_threads (on a pool of
        # threads, before the engine) and core.postprocess_in_sender (in the sender threads, on each response);
        # the renderer sets both for the plain model of entry: plain-core
        self.preprocess: LoadedStage | None = None
        self.postprocess: LoadedStage | None = None
        self._preprocess_pool: ThreadPoolExecutor | None = None
        if settings.core.preprocess_threads or settings.core.postprocess_in_sender:
            specs = json.loads((model_dir / STAGES_FILE).read_text())
            root = Path(args["model_repository"]).parent
            if settings.core.preprocess_threads:
                self.preprocess = LoadedStage(specs["preprocess"], root)
                # Tokenizing releases the GIL (the fast tokenizer's Rust code): a burst is tokenized side by side.
                self._preprocess_pool = ThreadPoolExecutor(
                    settings.core.preprocess_threads, thread_name_prefix="vllm-core-preprocess"
                )
            if settings.core.postprocess_in_sender:
                self.postprocess = LoadedStage(specs["postprocess"], root)
        self._warm_up(finish_watch, steps, lags)
        if self._metrics is not None:
            self._metrics.start()
        self.stats = CoreStats.from_environment(self.logger, steps, lags, fe.describe() if fe else "")
        self._outboxes: list[queue.SimpleQueue[Outgoing | None]] = [
            queue.SimpleQueue() for _ in range(settings.core.sender_threads)
        ]
        self._next_outbox = itertools.count()
        self._sender_threads = [
            threading.Thread(target=self._send_loop, args=(outbox,), name=f"vllm-core-sender-{i}", daemon=True)
            for i, outbox in enumerate(self._outboxes)
        ]
        for thread in self._sender_threads:
            thread.start()
        freeze_startup_heap()  # the engine, torch, vLLM: out of the cycle collector's sight (core/gc_heap.py)

    def _warm_up(self, finish_watch: FinishWatch | None, steps: EngineSteps | None, lags: EngineLags | None) -> None:
        """This front end's first request, before Triton calls the model ready (core/warm_up.py); the stat sinks
        then forget it, so vLLM's counters and the core's own count the clients' requests only."""
        start = time.perf_counter()
        responses, problem = warm_up(self.engine, stream=not self.plain)
        if problem is None and self.postprocess is not None and responses:
            inputs = {ENGINE_RESPONSE.name: document_array(ENGINE_RESPONSE, encode_response(responses[-1]))}
            try:
                self.postprocess.run_numpy(inputs, {})
            except Exception as exc:  # noqa: BLE001 - a stage of the deployment's own may want other parameters
                problem = f"postprocess: {type(exc).__name__}: {exc}"
        if problem is None and finish_watch is not None and not finish_watch.wait_finished(1, STATS_SECONDS):
            problem = "its statistics did not arrive"
        if self._metrics is not None:
            self._metrics.buffer.drain()
        if steps is not None:
            steps.snapshot()
        if lags is not None:
            lags.snapshot()
        took = 1000 * (time.perf_counter() - start)
        if problem is None:
            self.logger.log_info(f"vllm_core: warmed up in {took:.0f} ms")
        else:  # the model still loads: clients' first requests on this front end are then slower
            self.logger.log_warn(f"vllm_core: the warm-up request {problem} ({took:.0f} ms)")

    def _place(self, placement: EnginePlacement) -> None:
        # The whole server: tritonserver (this stub's parent) with every stub, and the engine's processes.
        engine, other = placement.apply(os.getppid(), engine_root=os.getpid())
        self.logger.log_info(f"vllm_core: {placement.describe()}: {len(engine)} engine, {len(other)} other processes")

    # At most this many queued responses are coalesced per pass, so one pass never holds the others for long.
    MAX_DRAIN = 1024

    def _send_loop(self, outbox: queue.SimpleQueue[Outgoing | None]) -> None:
        """Send each request's queued responses merged, at most one per stream interval (core/coalesce.py)."""
        pacer = StreamPacer(self.stream_interval)
        stopping = False
        while not stopping or pacer:
            batch: list[Outgoing | None] = []
            try:
                batch.append(outbox.get(timeout=pacer.wait_seconds(time.monotonic())))
                while len(batch) < self.MAX_DRAIN:
                    batch.append(outbox.get_nowait())
            except queue.Empty:
                pass
            for item in batch:
                if item is None:
                    stopping = True
                else:
                    pacer.add(item)
            for item in pacer.take_due(time.monotonic(), everything=stopping):
                self._send(item)

    def _send(self, item: Outgoing) -> None:
        if item.sender.closed:
            return  # its FINAL went already: the postprocess stage failed on an earlier response (see _response)
        try:
            if item.error is not None and item.sender.tagged:  # in-band: see EngineResponse.error
                message = triton_error(item.error, tagged=True).message()
                document = document_tensor(ENGINE_RESPONSE, encode_response(error_response(message)))
                response = pb_utils.InferenceResponse(output_tensors=[document])
            elif item.error is not None:
                response = pb_utils.InferenceResponse(error=triton_error(item.error))
            elif item.response is not None:
                response = self._response(item)
            else:
                response = None
            if response is None and item.sender.closed:
                return
            start = time.perf_counter()
            try:
                item.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if item.final else 0)
            finally:
                if self.stats is not None:
                    self.stats.sent(time.perf_counter() - start, id(item.sender))
        except Exception:  # noqa: BLE001 - e.g. the client is gone; the others must go on
            self.logger.log_warn(f"vllm_core: sending a response failed: {traceback.format_exc()}")

    def _response(self, item: Outgoing) -> Any:
        """One engine response as the caller asked for it: the engine response, or the postprocess stage's public
        outputs (core.postprocess_in_sender). A stage that fails ends the request with its error."""
        document = encode_response(item.response)
        if item.sender.stage_parameters is None:
            return pb_utils.InferenceResponse(output_tensors=[document_tensor(ENGINE_RESPONSE, document)])
        try:
            inputs = {ENGINE_RESPONSE.name: document_array(ENGINE_RESPONSE, document)}
            return pb_utils.InferenceResponse(output_tensors=self.postprocess.run(inputs, item.sender.stage_parameters))
        except Exception as exc:  # noqa: BLE001 - this request's error; the others go on
            if not isinstance(exc, (InvalidInput, Unavailable)):
                self.logger.log_error(f"vllm_core: postprocess failed: {traceback.format_exc()}")
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            item.sender.send(pb_utils.InferenceResponse(error=triton_error(exc)), flags=final)
            if item.sender.engine_request_id is not None:  # nobody reads the rest: stop generating it
                self.engine.cancel(item.sender.engine_request_id)
            return None

    def execute(self, requests: list[Any]) -> None:
        # Each execute is a ~1 ms round trip between tritonserver and this stub whatever it does (measured on the
        # H100, docs/performance-gpu.md): the rendered config batches, so requests that arrive together come in one
        # (not with core.postprocess_in_sender or core.preprocess_threads: its outputs or inputs are then the
        # ensemble's, unbatched).
        if self.stats is not None:
            self.stats.executed(len(requests))
        for request in requests:
            self._admit(request)
        return None

    def _admit(self, request: Any) -> None:
        outbox = self._outboxes[next(self._next_outbox) % len(self._outboxes)]
        sender = CoreSender(request.get_response_sender())
        if self.stats is not None:
            self.stats.admitted(id(sender))
        parameters = request_parameters(request)
        if self.plain:  # a client's own request: the control parameters of BLS callers are not its to give
            parameters = {k: v for k, v in parameters.items() if k not in CONTROL_PARAMETERS}
        # A BLS caller (an entry model or generate) gets error codes in the message (see child_error)
        sender.tagged = CANCEL_KEY_PARAMETER in parameters or CODE_TAG_PARAMETER in parameters
        # The streaming ensemble's step asks for the postprocess stage's outputs, a BLS caller for ENGINE_RESPONSE.
        if self.postprocess is not None and ENGINE_RESPONSE.name not in request.requested_output_names():
            sender.stage_parameters = parameters
        if ABORT_PARAMETER in parameters:  # a control request from an entry model: abort by keys
            for key in str(parameters[ABORT_PARAMETER]).split(","):
                self.engine.cancel_key(key)
            outbox.put(Outgoing(sender, None, None, True))
            return
        key = str(parameters.get(CANCEL_KEY_PARAMETER, ""))
        tensor = pb_utils.get_input_tensor_by_name(request, ENGINE_REQUEST.name)
        if tensor is None and self._preprocess_pool is not None:
            # The streaming ensemble's public inputs, read here while Triton's request is at hand (copies: the
            # pool's thread uses them after execute returned)
            inputs = {name: np.array(value) for name, value in self.preprocess.inputs_of(request).items()}
            self._preprocess_pool.submit(self._preprocess_and_submit, inputs, parameters, sender, outbox, key)
            return
        try:
            # Typed decoding: a wrong type or an unknown field fails here, naming it (core/protocol.py).
            engine_request = decode_request(tensor.as_numpy().reshape(-1)[0])
        except Exception as exc:  # noqa: BLE001 - a missing tensor, not JSON, or not an EngineRequest
            outbox.put(Outgoing(sender, None, InvalidInput(f"{ENGINE_REQUEST.name}: malformed ({exc})"), True))
            return
        self._submit(engine_request, sender, outbox, key)

    def _preprocess_and_submit(
        self,
        inputs: dict[str, Any],
        parameters: dict[str, Any],
        sender: CoreSender,
        outbox: queue.SimpleQueue[Outgoing | None],
        key: str,
    ) -> None:
        """On a preprocess thread (core.preprocess_threads): the streaming ensemble's request through the preprocess
        stage, then to the engine. A request the stage refuses (INVALID_ARG) or fails on ends with that error."""
        try:
            document = self.preprocess.run_numpy(inputs, parameters)[ENGINE_REQUEST.name]
            engine_request = decode_request(document.reshape(-1)[0])
            if self.plain:  # one response: the whole answer as one output, whatever `stream` asked
                engine_request = msgspec.structs.replace(engine_request, stream=False)
        except Exception as exc:  # noqa: BLE001 - this request's error; the others go on
            if not isinstance(exc, (InvalidInput, Unavailable)):
                self.logger.log_error(f"vllm_core: preprocess failed: {traceback.format_exc()}")
            outbox.put(Outgoing(sender, None, exc, True))
            return
        self._submit(engine_request, sender, outbox, key)

    def _submit(
        self, engine_request: EngineRequest, sender: CoreSender, outbox: queue.SimpleQueue[Outgoing | None], key: str
    ) -> None:
        # The core's requests are ensemble steps or BLS children, where is_cancelled never turns true on 2.51, and
        # each probe is an IPC round trip (~0.3 s each measured in a busy stub): no probe; entry models see the
        # client's cancel and abort by key. The plain model (entry: plain-core) is the client's own model: its
        # requests are probed if the deployment asks (generate.watch_cancels).
        is_cancelled = sender.is_cancelled if self.watch_cancels else None
        sender.engine_request_id = self.engine.submit(
            engine_request, _emitter(outbox, sender, self.stats), is_cancelled, key=key
        )

    def finalize(self) -> None:
        if self._preprocess_pool is not None:  # what it has taken in reaches the engine, which ends it below
            self._preprocess_pool.shutdown(wait=True)
        self.engine.shutdown()
        if self._metrics is not None:
            self._metrics.stop()
        for outbox in self._outboxes:
            outbox.put(None)
        for thread in self._sender_threads:
            thread.join(timeout=10)
        if self.stats is not None:
            self.stats.stop()
