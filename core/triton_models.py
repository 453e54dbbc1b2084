"""The Triton Python-backend adapters. Each `model_repository/*/1/model.py` imports one of these classes.

Only this module (and the model.py files) imports `triton_python_backend_utils`; the logic they call lives in
Triton-free modules (core.engine, core.protocol, the stage packages), where unit tests reach it.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from core.coalesce import Outgoing, StreamPacer
from core.core_stats import CoreStats
from core.engine import Engine, prepare_process_environment
from core.engine_config import ENGINE_ARGS_FILE, load_engine_args, resolve_path, resolve_paths
from core.interface import ENGINE_REQUEST, ENGINE_RESPONSE, InvalidInput, Unavailable
from core.metrics import COUNTERS, GAUGES, HISTOGRAMS, StatsBuffer, stat_logger_factory
from core.protocol import EngineRequest, EngineResponse, merge_responses
from core.settings import CoreSettings, EntrySettings, GenerateSettings, load_settings
from core.stage import load_stage_class

STAGE_FILE = "stage.json"
LORA_FILE = "multi_lora.json"
STAGE_PATH_KEYS = ("tokenizer", "chat_template_file")
ENTRY_STAGES_FILE = "stages.json"
# Request parameters between an entry model and the core (docs/platform-notes.md T5: on Triton 2.51 a client's cancel
# does not reach a BLS child, so the entry model, which does see it, aborts its core request by key).
CANCEL_KEY_PARAMETER = "cancel_key"
ABORT_PARAMETER = "abort"
CODE_TAG_PARAMETER = "tag_error_codes"  # a BLS caller asks the core to tag error codes into messages


def _model_dir(args: dict[str, Any]) -> Path:
    return Path(args["model_repository"]) / args["model_version"]


def _triton_error(exc: BaseException, tagged: bool = False) -> Any:
    for kind, code in ((InvalidInput, "INVALID_ARG"), (Unavailable, "UNAVAILABLE")):
        if isinstance(exc, kind):
            message = f"[{code}] {exc}" if tagged else str(exc)
            return pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))
    return pb_utils.TritonError(f"internal error: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)


def _child_error(error: Any) -> Any:
    """A BLS child's error for our own client, with its code: measured on 2.51, a BLS response's error comes
    back as INTERNAL whatever code the child set, so the core tags the code into the message for BLS callers."""
    message, code = error.message(), error.code()
    for name in ("INVALID_ARG", "UNAVAILABLE"):
        tag = f"[{name}] "
        if message.startswith(tag):
            message, code = message[len(tag) :], getattr(pb_utils.TritonError, name)
    return pb_utils.TritonError(message, code)


def _never_cancelled() -> bool:
    return False


def _request_parameters(request: Any) -> dict[str, Any]:
    raw = request.parameters()
    return json.loads(raw) if raw else {}


def _string_tensor(name: str, text: str) -> Any:
    return pb_utils.Tensor(name, np.array([text.encode("utf-8")], dtype=np.object_))


class GuardedSender:
    """A response sender whose `is_cancelled()` is safe to call from any thread at any time.

    Measured on Triton 2.51: `is_cancelled()` on a sender whose FINAL response was already sent reaches
    TRITONBACKEND_ResponseFactoryIsCancelled on a freed factory and kills the server (SIGSEGV). Cancel
    watchers poll from other threads, so sending FINAL and probing are serialised here, and a closed sender
    answers True without asking Triton.
    """

    def __init__(self, sender: Any) -> None:
        self._sender = sender
        self._lock = threading.Lock()
        self.closed = False
        self.tagged = False  # the caller is a BLS model: error codes go into the message (see _child_error)

    def send(self, response: Any = None, flags: int = 0) -> None:
        with self._lock:
            if self.closed:
                return
            if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.closed = True
            self._sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        with self._lock:
            return self.closed or self._sender.is_cancelled()


def _lora_adapters(lora_file: Path, repository_root: Path) -> dict[str, str]:
    """multi_lora.json, name -> adapter path, with the same path rule as model.json; every local adapter must
    exist now: vLLM loads an adapter at its first request, and a missing one kills the EngineCore for everyone."""
    if not lora_file.exists():
        return {}
    names = json.loads(lora_file.read_text(encoding="utf-8"))
    adapters = resolve_paths(names, repository_root, tuple(names))
    for name, path in adapters.items():
        if Path(path).is_absolute() and not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"{lora_file}: LoRA adapter {name!r}: no adapter_config.json in {path}")
    return adapters


def _load_stage_class(spec: dict[str, Any], repository_root: Path) -> type:
    """A stage.json entry's class, imported with its code_paths (relative ones start at the repository root, like
    model.json's paths)."""
    folders = [resolve_path(p, repository_root) for p in spec.get("code_paths", [])]
    return load_stage_class(spec["class"], folders)


class StageModel:
    """A preprocess or postprocess stage: `stage.json` names the class and its settings."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        spec = json.loads((_model_dir(args) / STAGE_FILE).read_text())
        repository_root = Path(args["model_repository"]).parent
        stage_class = _load_stage_class(spec, repository_root)
        self.stage = stage_class(resolve_paths(spec.get("settings", {}), repository_root, STAGE_PATH_KEYS))
        self.input_names = [t.name for t in stage_class.inputs]
        self.output_types = {t.name: t.numpy_dtype for t in stage_class.outputs}

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._run(request) for request in requests]

    def _run(self, request: Any) -> Any:
        try:
            inputs = {}
            for name in self.input_names:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            outputs = self.stage.process(inputs, _request_parameters(request))
            return pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, np.asarray(value, dtype=self.output_types[name]))
                    for name, value in outputs.items()
                ]
            )
        except InvalidInput as exc:
            return pb_utils.InferenceResponse(error=_triton_error(exc))
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the model down
            self.logger.log_error(f"stage {type(self.stage).__name__} failed: {traceback.format_exc()}")
            return pb_utils.InferenceResponse(error=_triton_error(exc))


class TritonMetrics:
    """Publishes vLLM's stats as Triton custom metrics from ONE thread (see core/metrics.py for why)."""

    PUBLISH_SECONDS = 0.2

    def __init__(self, labels: dict[str, str]) -> None:
        self.buffer = StatsBuffer()
        kinds = pb_utils.MetricFamily
        # The families must outlive their metrics (Triton deletes a family's metrics with it): keep both.
        self._families: list[Any] = []

        def metric(name: str, doc: str, kind: Any, **extra: Any) -> Any:
            family = kinds(name=name, description=doc, kind=kind)
            self._families.append(family)
            return family.Metric(labels=labels, **extra)

        self._counters = {key: metric(name, doc, kinds.COUNTER) for key, (name, doc) in COUNTERS.items()}
        self._gauges = {key: metric(name, doc, kinds.GAUGE) for key, (name, doc) in GAUGES.items()}
        self._histograms = {
            key: metric(name, doc, kinds.HISTOGRAM, buckets=buckets) for key, (name, doc, buckets) in HISTOGRAMS.items()
        }
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)
        self._counters = self._gauges = self._histograms = {}  # metrics before their families
        self._families.clear()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self.buffer.changed.wait(self.PUBLISH_SECONDS)
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - metrics must never take serving down
                pb_utils.Logger.log_error(f"vllm_core: publishing metrics failed: {traceback.format_exc()}")
            time.sleep(self.PUBLISH_SECONDS)  # batch the next engine steps into one publish

    def _publish(self) -> None:
        delta = self.buffer.drain()
        for key, value in delta.counters.items():
            if value:
                self._counters[key].increment(value)
        for key, value in (delta.gauges or {}).items():
            self._gauges[key].set(value)
        for key, values in delta.samples.items():
            for value in values:
                self._histograms[key].observe(value)


def _emitter(outbox: queue.SimpleQueue[Outgoing | None], sender: Any):
    def emit(response: EngineResponse | None, error: Exception | None, final: bool) -> None:
        outbox.put(Outgoing(sender, response, error, final or error is not None))

    return emit


class CoreModel:
    """Decoupled: owns the vLLM engine; one response per engine output (one in all when not streaming)."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        model_dir = _model_dir(args)
        loras = _lora_adapters(model_dir / LORA_FILE, Path(args["model_repository"]).parent)
        settings = load_settings(CoreSettings, model_dir)
        # The deployment's engine_env, before vLLM reads it; the EngineCore process inherits it.
        os.environ.update(settings.engine_env)
        prepare_process_environment()  # before anything imports vLLM
        self._metrics: TritonMetrics | None = None
        stat_loggers = None
        if settings.metrics:
            self._metrics = TritonMetrics({"model": args["model_name"], "version": args["model_version"]})
            stat_loggers = [stat_logger_factory(self._metrics.buffer)]
        self.engine = Engine(
            load_engine_args(model_dir / ENGINE_ARGS_FILE),
            lora_adapters=loras,
            stat_loggers=stat_loggers,
            # Triton 2.51's Python backend cannot mark the model not ready: the engine restarts itself instead.
            restart=settings.health,
        )
        self.engine.start()
        if self._metrics is not None:
            self._metrics.start()
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
        self.stats = CoreStats.from_environment(self.logger)
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
        try:
            if item.error is not None:
                response = pb_utils.InferenceResponse(error=_triton_error(item.error, item.sender.tagged))
            elif item.response is not None:
                tensor = _string_tensor(ENGINE_RESPONSE.name, item.response.to_json())
                response = pb_utils.InferenceResponse(output_tensors=[tensor])
            else:
                response = None
            start = time.perf_counter()
            item.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if item.final else 0)
            if self.stats is not None:
                self.stats.sent(time.perf_counter() - start)
        except Exception:  # noqa: BLE001 - e.g. the client is gone; the others must go on
            self.logger.log_warn(f"vllm_core: sending a response failed: {traceback.format_exc()}")

    def execute(self, requests: list[Any]) -> None:
        # Measured on the H100 (README "Performance on a GPU"): each execute is a ~1 ms round trip between
        # tritonserver and this stub whatever it does (moving the parsing below to a thread of its own changed
        # nothing), so requests that arrive together queue for it.
        if self.stats is not None:
            self.stats.executed(len(requests))
        for request in requests:
            self._admit(request)
        return None

    def _admit(self, request: Any) -> None:
        outbox = self._outboxes[next(self._next_outbox) % len(self._outboxes)]
        sender = GuardedSender(request.get_response_sender())
        parameters = _request_parameters(request)
        # A BLS caller (an entry model or generate) gets error codes in the message (see _child_error)
        sender.tagged = CANCEL_KEY_PARAMETER in parameters or CODE_TAG_PARAMETER in parameters
        if ABORT_PARAMETER in parameters:  # a control request from an entry model: abort by keys
            for key in str(parameters[ABORT_PARAMETER]).split(","):
                self.engine.cancel_key(key)
            outbox.put(Outgoing(sender, None, None, True))
            return
        try:
            tensor = pb_utils.get_input_tensor_by_name(request, ENGINE_REQUEST.name)
            engine_request = EngineRequest.from_json(tensor.as_numpy().reshape(-1)[0])
        except Exception as exc:  # noqa: BLE001
            outbox.put(Outgoing(sender, None, InvalidInput(f"{ENGINE_REQUEST.name}: malformed ({exc})"), True))
            return
        key = str(parameters.get(CANCEL_KEY_PARAMETER, ""))
        # No is_cancelled probe here: the core's requests are ensemble steps or BLS children, where it never
        # turns true on 2.51, and each probe is an IPC round trip (~0.3 s each measured in a busy stub). Entry
        # models see the client's cancel and abort by key instead.
        self.engine.submit(engine_request, _emitter(outbox, sender), _never_cancelled, key=key)

    def finalize(self) -> None:
        self.engine.shutdown()
        if self._metrics is not None:
            self._metrics.stop()
        for outbox in self._outboxes:
            outbox.put(None)
        for thread in self._sender_threads:
            thread.join(timeout=10)
        if self.stats is not None:
            self.stats.stop()


class GenerateModel:
    """Non-decoupled BLS: drives the decoupled core and answers each request with one merged response.

    `execute` hands each request to a worker thread and returns None at once; the worker answers through the
    request's own response sender (one response, FINAL), so requests never wait for each other
    (docs/platform-notes.md T3). Worker threads block in Triton's BLS response iterator, which releases the GIL
    while waiting.
    """

    # Iterators of cancelled requests are kept this long before Python may free them (see _release).
    DEFERRED_RELEASE_SECONDS = 5.0

    SETTINGS: type[GenerateSettings] = GenerateSettings

    def initialize(self, args: dict[str, Any]) -> None:
        self.logger = pb_utils.Logger
        self.settings = load_settings(self.SETTINGS, _model_dir(args))
        self.core_model = self.settings.core_model
        self.pool = ThreadPoolExecutor(max_workers=self.settings.max_in_flight, thread_name_prefix="generate")
        self._graveyard: deque[tuple[float, Any]] = deque()
        self._graveyard_lock = threading.Lock()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self.pool.submit(self._serve, request, GuardedSender(request.get_response_sender()))
        return None

    def _serve(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            response = self._generate(request, sender)
        except Exception as exc:  # noqa: BLE001
            if not isinstance(exc, (InvalidInput, Unavailable)):
                self.logger.log_error(f"generate failed: {traceback.format_exc()}")
            response = pb_utils.InferenceResponse(error=_triton_error(exc))
        sender.send(response, flags=final)

    def _generate(self, request: Any, sender: Any) -> Any:
        engine_request = pb_utils.get_input_tensor_by_name(request, ENGINE_REQUEST.name)
        if engine_request is None:
            raise InvalidInput(f"{ENGINE_REQUEST.name} is missing")
        child = pb_utils.InferenceRequest(
            model_name=self.core_model,
            inputs=[engine_request],
            requested_output_names=[ENGINE_RESPONSE.name],
            parameters={CODE_TAG_PARAMETER: True},
        )
        iterator = child.exec(decoupled=True)
        deltas: list[EngineResponse] = []
        error = None
        for child_response in iterator:
            if child_response.has_error():
                error = child_response.error()
                continue
            tensor = pb_utils.get_output_tensor_by_name(child_response, ENGINE_RESPONSE.name)
            if tensor is not None:
                deltas.append(EngineResponse.from_json(tensor.as_numpy().reshape(-1)[0]))
        self._release(iterator, sender)
        if error is not None:
            return pb_utils.InferenceResponse(error=_child_error(error))
        if not deltas:
            raise Unavailable(f"{self.core_model} returned no response")
        merged = merge_responses(deltas)
        return pb_utils.InferenceResponse(output_tensors=[_string_tensor(ENGINE_RESPONSE.name, merged.to_json())])

    def _release(self, iterator: Any, sender: Any) -> None:
        """Drop the BLS response iterator only when the Triton 2.51 stub can no longer be freeing it.

        On 2.51 the stub may destroy a dropped iterator (and its numpy object arrays) off the GIL while the
        server's cleanup message for it is still in flight; under load that corrupted the stub's heap
        (docs/platform-notes.md T3; fixed upstream in python_backend b771f4f). `is_cancelled()` is a round trip
        through the same stub<->server queue, so once it returns that message has been handled. A cancelled
        request answers `is_cancelled()` from a cached flag without the round trip, so its iterator is
        parked for a few seconds instead.
        """
        cancelled = sender.is_cancelled()
        now = time.monotonic()
        with self._graveyard_lock:
            if cancelled:
                self._graveyard.append((now + self.DEFERRED_RELEASE_SECONDS, iterator))
            while self._graveyard and self._graveyard[0][0] <= now:
                self._graveyard.popleft()

    def finalize(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self._graveyard.clear()


class EntryModel(GenerateModel):
    """A public entry that is not an ensemble: preprocess and postprocess stages run in-process, the core by BLS.

    Why (docs/platform-notes.md T5, measured on Triton 2.51): a client's cancel (gRPC stream cancel, SSE disconnect,
    plain-request timeout) reaches only the top-level model of its request. Inside an ensemble no step sees
    it (`is_cancelled()` stays false, `send` keeps succeeding), and a BLS iterator has no `cancel()`. This
    model is the top level, so a watcher thread polls each request's `is_cancelled()` and aborts its core
    request with a control request carrying the request's cancel key. settings.json's `stream` makes it the
    decoupled streaming entry (one response per delta) or the plain one (one merged response).
    """

    CANCEL_POLL_SECONDS = 0.25
    SETTINGS = EntrySettings

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self.streaming = self.settings.stream
        spec = json.loads((_model_dir(args) / ENTRY_STAGES_FILE).read_text())
        repository_root = Path(args["model_repository"]).parent
        self.stages = {}
        for role in ("preprocess", "postprocess"):
            stage_class = _load_stage_class(spec[role], repository_root)
            stage = stage_class(resolve_paths(spec[role].get("settings", {}), repository_root, STAGE_PATH_KEYS))
            self.stages[role] = (
                stage,
                [t.name for t in stage_class.inputs],
                {t.name: t.numpy_dtype for t in stage_class.outputs},
            )
        self._live: dict[str, Any] = {}  # cancel key -> response sender, for the watcher
        self._live_lock = threading.Lock()
        self._closing = threading.Event()
        self._probes = ThreadPoolExecutor(max_workers=32, thread_name_prefix="entry-cancel-probe")
        self._watcher = threading.Thread(target=self._watch, name="entry-cancel-watch", daemon=True)
        self._watcher.start()

    def _run_stage(self, role: str, inputs: dict[str, Any], parameters: dict[str, Any]) -> list[Any]:
        stage, _, output_types = self.stages[role]
        outputs = stage.process(inputs, parameters)
        return [pb_utils.Tensor(name, np.asarray(value, dtype=output_types[name])) for name, value in outputs.items()]

    def _serve(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            self._entry(request, sender)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the model down
            if not isinstance(exc, (InvalidInput, Unavailable)):
                self.logger.log_error(f"entry failed: {traceback.format_exc()}")
            sender.send(pb_utils.InferenceResponse(error=_triton_error(exc)), flags=final)

    def _entry(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        _, input_names, _ = self.stages["preprocess"]
        inputs = {}
        for name in input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        (engine_request,) = self._run_stage("preprocess", inputs, _request_parameters(request))
        key = f"{uuid.uuid4().hex}"
        child = pb_utils.InferenceRequest(
            model_name=self.core_model,
            inputs=[engine_request],
            requested_output_names=[ENGINE_RESPONSE.name],
            parameters={CANCEL_KEY_PARAMETER: key},
        )
        with self._live_lock:  # before exec: a cancel that comes while exec waits must be seen too
            self._live[key] = sender
        try:
            iterator = child.exec(decoupled=True)
            deltas: list[EngineResponse] = []
            error = None
            last: list[Any] | None = None  # a stream's last outputs: sent with FINAL after the release barrier
            abandoned = False
            for child_response in iterator:
                if child_response.has_error():
                    error = child_response.error()
                    continue
                tensor = pb_utils.get_output_tensor_by_name(child_response, ENGINE_RESPONSE.name)
                if tensor is None:
                    continue
                delta = EngineResponse.from_json(tensor.as_numpy().reshape(-1)[0])
                if self.streaming:
                    if abandoned:
                        continue  # drain the core's remaining responses; the abort is on its way
                    outputs = self._run_stage("postprocess", {ENGINE_RESPONSE.name: tensor.as_numpy()}, {})
                    if delta.finished:
                        last = outputs
                        continue
                    try:
                        sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
                    except Exception:  # noqa: BLE001 - the client is gone (a cancelled stream refuses sends)
                        abandoned = True
                        if self._claim(key):
                            self._abort([key], sender)
                else:
                    deltas.append(delta)
        finally:
            with self._live_lock:
                self._live.pop(key, None)
        self._release(iterator, sender)
        if abandoned or sender.closed:
            return
        if error is not None:
            sender.send(pb_utils.InferenceResponse(error=_child_error(error)), flags=final)
            return
        if self.streaming:
            # docs/platform-notes.md T8: the last data travels with FINAL (a bare FINAL only if the core sent none)
            sender.send(None if last is None else pb_utils.InferenceResponse(output_tensors=last), flags=final)
            return
        if not deltas:
            raise Unavailable(f"{self.core_model} returned no response")
        merged = np.array([merge_responses(deltas).to_json().encode("utf-8")], dtype=np.object_)
        outputs = self._run_stage("postprocess", {ENGINE_RESPONSE.name: merged}, {})
        sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=final)

    def _watch(self) -> None:
        while not self._closing.wait(self.CANCEL_POLL_SECONDS):
            with self._live_lock:
                live = list(self._live.items())
            start = time.monotonic()
            # Probed in parallel: each probe is an IPC round trip that queues behind the stub's response
            # traffic (measured ~0.3 s each with 160 busy streams, so a serial sweep of 177 took 51 s).
            flags = list(self._probes.map(lambda item: item[1].is_cancelled(), live))
            cancelled = [
                (key, sender) for (key, sender), flag in zip(live, flags, strict=True) if flag and self._claim(key)
            ]
            if cancelled:  # one control request for the whole sweep: BLS calls are slow in a busy stub
                self._abort([key for key, _ in cancelled], cancelled[0][1])
                self.logger.log_info(
                    f"entry: aborted {len(cancelled)} cancelled of {len(live)} requests"
                    f" in {time.monotonic() - start:.2f} s"
                )

    def _claim(self, key: str) -> bool:
        """True for the one caller that gets to abort this key (the watcher or a failed send)."""
        with self._live_lock:
            return self._live.pop(key, None) is not None

    def _abort(self, keys: list[str], sender: Any) -> None:
        control = pb_utils.InferenceRequest(
            model_name=self.core_model,
            inputs=[_string_tensor(ENGINE_REQUEST.name, "{}")],
            requested_output_names=[ENGINE_RESPONSE.name],
            parameters={ABORT_PARAMETER: ",".join(keys)},
        )
        try:
            iterator = control.exec(decoupled=True)
            for _ in iterator:
                pass
            self._release(iterator, sender)  # the sender is cancelled: the iterator is parked (see _release)
        except Exception:  # noqa: BLE001 - the core is gone: nothing left to abort
            self.logger.log_warn(f"entry: aborting {keys} failed: {traceback.format_exc()}")

    def finalize(self) -> None:
        self._closing.set()
        super().finalize()
