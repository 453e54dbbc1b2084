"""One vLLM async engine on its own event-loop thread, fed with EngineRequests, streaming EngineResponses.

Triton-free: the core model's adapter (core/adapters/core_model.py) gives each request an `emit` callback and an
`is_cancelled` probe. The engine loop never blocks on Triton: `emit` only enqueues (the adapter sends from
its own thread, which is what gave the vLLM backend +18%).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import locale
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from core import front_ends
from core.engine_config import serving_usage_context
from core.engine_lags import EngineLags
from core.front_ends import FrontEnd, LaunchedEngine
from core.gc_heap import freeze_startup_heap, unfreeze_heap
from core.interface import InvalidInput, Unavailable, check_lora
from core.protocol import EngineRequest, EngineResponse
from core.settings import HealthSettings
from core.token_sync import sync_token_ids
from core.token_windows import TokenWindows, decode_options
from core.vllm_io import client_errors, every_sequence, rgb_image, sampling_params, to_engine_response
from core.vllm_version import check_vllm_version

log = logging.getLogger("vllm_core")
if not log.handlers:  # the stub's Python configures no logging: warnings would print bare, without a source
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s vllm_core %(levelname)s: %(message)s"))
    log.addHandler(_handler)
    log.propagate = False

# emit(response, error, final): exactly one call has final=True; an error call is always final.
Emit = Callable[[EngineResponse | None, Exception | None, bool], None]

CANCEL_POLL_SECONDS = 0.5
PROBE_THREADS = 32  # the watcher's probes in flight at once (as the entry models' watchers)
EARLY_ABORTS_KEPT = 4096
HEALTH_POLL_SECONDS = 0.25  # how often the supervisor looks at vLLM's own `errored` flag
DRAIN_SECONDS = 5.0  # after a death, how long in-flight requests get to receive vLLM's EngineDeadError
STABLE_SECONDS = 60.0  # a restarted engine that dies sooner than this counts as a failed restart
END_HANDLER_SECONDS = 5.0  # a front end's quiet end of its client's output handler (the loop is idle by then)
RESTARTING = "the vLLM engine died and is restarting; retry in a few seconds"


# What to do when the engine dies: the deployment's `health` key, with its defaults in one place (core/settings.py).
RestartPolicy = HealthSettings


def prepare_process_environment() -> None:
    """Settings vLLM needs inside a Triton Python-backend stub (measured: docs/platform-notes.md E2, E5)."""
    # The stub's embedded Python runs with LC_CTYPE=C, and torch reads its .jinja files as ASCII then.
    with contextlib.suppress(locale.Error):
        locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM's EngineCore spawned as a fresh python3, not a fork of this process (core/engine_start_method.py).
    from core.engine_start_method import install as spawn_the_engine_core

    spawn_the_engine_core()
    # Semaphores named after the server, before vLLM creates any: the launcher removes what a killed server left.
    from core.process_names import install as name_semaphores

    name_semaphores()
    # vLLM's LLaVA code imports a torchvision-only transformers module; CPU machines have no usable torchvision.
    from core.torchvision_free import install

    install()
    # AMX requested before vLLM's CPU attention kernel may use it (else SIGILL on some machines).
    from core.cpu_amx import install as request_amx

    request_amx()


def start_own_engine(engine_args: dict[str, Any], stat_loggers: list[Any] | None) -> Any:
    """vLLM's AsyncLLM with an EngineCore of its own, configured as every engine of the core is: with vLLM's server
    defaults for what the engine args leave out (core/engine_config.py)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(
        AsyncEngineArgs(**engine_args), usage_context=serving_usage_context(), stat_loggers=stat_loggers
    )


class _FinalOnce:
    """Wraps an Emit: remembers whether the final call happened, and drops anything after it."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self.done = False

    def __call__(self, response: EngineResponse | None, error: Exception | None, final: bool) -> None:
        if self.done:
            return
        self.done = final or error is not None
        self._emit(response, error, final)


@dataclass
class _Live:
    is_cancelled: Callable[[], bool] | None
    emit: _FinalOnce
    key: str = ""
    task: asyncio.Task | None = None
    cancel_requested: bool = False


def _probe(is_cancelled: Callable[[], bool]) -> bool:
    try:
        return bool(is_cancelled())
    except Exception:  # noqa: BLE001 - a probe that fails means the request is gone
        return True


class Engine:
    def __init__(
        self,
        engine_args: dict[str, Any],
        lora_adapters: dict[str, str] | None = None,
        offload_detokenization: bool = True,
        stat_loggers: list[Any] | None = None,
        restart: RestartPolicy | None = None,
        on_start: Callable[[], None] | None = None,
        lags: EngineLags | None = None,
        front_end: FrontEnd | None = None,
    ) -> None:
        prepare_process_environment()
        # One of several front ends sharing one EngineCore (core/front_ends.py), or None: this process's own engine.
        self._front_end = front_end
        self._launched: LaunchedEngine | None = None  # the shared EngineCore, when this front end launched it
        self._lags = lags  # the trips to and from the EngineCore, by its clock (core/engine_lags.py), or None
        self._on_start = on_start  # called after each start of vLLM's engine (the first and every restart)
        self._stat_loggers = stat_loggers
        self._restart = restart or RestartPolicy()  # the deployment default: restart
        if front_end is not None and self._restart.restart_engine:
            raise ValueError("an engine shared by several front ends cannot be restarted: set restart_engine false")
        # Why new requests are refused while the engine is down (None while it runs); read from any thread.
        self._down_reason: str | None = None
        self._restarted_at: float | None = None  # when the current engine came up by a restart
        self.restarts = 0  # successful restarts so far
        # Let postprocess turn ids into text (postprocess/detokenize.py) unless a request needs vLLM's own
        # detokenizer in this process: stop strings (vLLM must see the text to stop generating).
        self._offload_detokenization = offload_detokenization
        self._sync_ids: frozenset[int] | None = None
        self._engine_args = engine_args
        self._lora_adapters = dict(lora_adapters or {})
        self._ids = itertools.count()
        self._in_flight: set[str] = set()
        # request id -> its probe, emitter and task; the cancel watcher polls the probes.
        self._live: dict[str, _Live] = {}
        self._keys: dict[str, str] = {}  # caller's cancel key -> request id
        self._early_aborts: dict[str, None] = {}  # keys aborted before their request arrived (insertion order)
        self._live_lock = threading.Lock()
        # Submitted requests waiting for the engine loop, taken in by one callback however many arrived (_intake):
        # the loop has a wake-up pending exactly while this list is not empty.
        self._arrivals: list[tuple[str, EngineRequest, float]] = []  # (id, request, time.monotonic() at submit)
        self._closing = threading.Event()
        self._watcher = threading.Thread(target=self._watch_cancellations, name="vllm-cancel-watch", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._llm: Any = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-engine-loop", daemon=True)

    # Lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            warning = check_vllm_version()
            if warning:
                log.warning(warning)
            self._llm = self._new_llm()
            if self._offload_detokenization and self._llm.tokenizer is not None:
                self._sync_ids = sync_token_ids(self._llm.tokenizer)
        except BaseException as exc:  # noqa: BLE001 - handed to start() in the caller's thread
            self._start_error = exc
            self._started.set()
            return
        self._started.set()
        self._watcher.start()
        supervisor = asyncio.ensure_future(self._supervise()) if self._restart.restart_engine else None
        await self._stop.wait()
        if supervisor is not None:
            supervisor.cancel()
        if self._llm is None:
            return
        if self._in_flight and not self.errored:
            await self._llm.abort(list(self._in_flight))
        self._llm.shutdown()
        self._end_shared_engine()

    def _new_llm(self) -> Any:
        if self._front_end is not None:
            llm = self._attach_front_end(self._front_end)
        else:
            llm = start_own_engine(self._engine_args, self._stat_loggers)
        if self._on_start is not None:
            self._on_start()
        try:
            return llm
        finally:
            del llm  # this frame outlives the call (docs/platform-notes.md E4): it must not keep the engine

    def _attach_front_end(self, fe: FrontEnd) -> Any:
        """Front end 0 launches the shared EngineCore and publishes its process ids; every front end then attaches
        its own client and watches those processes (vLLM's client only notices the death of an engine it owns)."""
        if fe.launches_engine:
            front_ends.clear_published(fe)
            try:
                config, executor = front_ends.vllm_config(self._engine_args)
                self._launched = front_ends.launch_engine(config, executor, fe, self._log_stats())
            except BaseException as exc:
                front_ends.publish_launch_failure(fe, exc)
                raise
            pids = self._launched.pids
            front_ends.publish_engine_pids(fe, pids)
        else:
            from vllm import envs

            pids = front_ends.read_engine_pids(fe, wait_seconds=float(envs.VLLM_ENGINE_READY_TIMEOUT_S))
            config, executor = front_ends.vllm_config(self._engine_args)
        try:
            llm = front_ends.attach_client(config, executor, fe, self._stat_loggers, self._engine_args)
        except BaseException:
            self._end_shared_engine()
            raise
        front_ends.watch_engine(pids, functools.partial(self._shared_engine_died, llm, fe), self._closing)
        log.info("%s: attached to the engine (EngineCore process %s)", fe.describe(), ", ".join(map(str, pids)))
        try:
            return llm
        finally:
            del llm  # this frame outlives the call (docs/platform-notes.md E4): it must not keep the engine

    def _log_stats(self) -> bool:
        return front_ends.stats_logged(self._engine_args, self._stat_loggers)

    def _shared_engine_died(self, llm: Any, fe: FrontEnd, pid: int) -> None:
        """What vLLM's own monitor does for the client that launched its engine: mark it dead and shut the client
        down, which fails every request in flight with EngineDeadError (UNAVAILABLE) and refuses new ones."""
        if front_ends.engine_stopped(fe):  # front end 0 ended it: the server (or the model) is shutting down
            log.warning("%s: the shared vLLM engine was stopped by front end 0", fe.describe())
            if self._loop is not None:  # quietly: an end on purpose is not the client's failure
                with contextlib.suppress(Exception):
                    ended = asyncio.run_coroutine_threadsafe(front_ends.end_output_handler(llm), self._loop)
                    ended.result(timeout=END_HANDLER_SECONDS)
        else:
            log.error("the shared vLLM engine died (EngineCore process %d ended); requests get UNAVAILABLE", pid)
        with contextlib.suppress(Exception):
            llm.engine_core.resources.engine_dead = True
            llm.engine_core.shutdown()

    def _end_shared_engine(self) -> None:
        if self._launched is not None:
            if self._front_end is not None:
                front_ends.clear_published(self._front_end)  # first: the others then know the end was meant
            self._launched.shutdown()
            self._launched = None

    # Restart after the engine died --------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Watch vLLM's `errored` flag (its own monitor thread sets it when the EngineCore process exits) and
        replace a dead engine by a new one in this process, with backoff and a bound (RestartPolicy)."""
        policy = self._restart
        failures = 0  # restarts in a row that did not hold
        while not self._closing.is_set():
            await asyncio.sleep(HEALTH_POLL_SECONDS)
            if self._llm is None or not self._llm.errored:
                continue
            died_at = time.monotonic()
            held = self._restarted_at is None or died_at - self._restarted_at >= STABLE_SECONDS
            failures = 0 if held else failures + 1
            self._down_reason = RESTARTING
            log.error(
                "the vLLM engine died; requests in flight get UNAVAILABLE%s",
                "" if held else f"; the last restart did not hold ({failures} in a row)",
            )
            await self._drain()
            while True:
                if failures >= policy.max_restarts:
                    self._down_reason = (
                        f"the vLLM engine died and {failures} restart(s) in a row failed; it stays down until"
                        " the server is restarted"
                    )
                    log.error("giving up on the vLLM engine after %d failed restart(s) in a row", failures)
                    return
                delay = policy.restart_backoff_seconds * 2**failures
                log.warning(
                    "restarting the vLLM engine in %.1f s (attempt %d of %d)", delay, failures + 1, policy.max_restarts
                )
                await asyncio.sleep(delay)
                if self._closing.is_set():
                    return
                start = time.monotonic()
                try:
                    self._replace_llm()
                except Exception:  # noqa: BLE001 - counted and retried with backoff
                    failures += 1
                    log.exception("restarting the vLLM engine failed (%d in a row)", failures)
                    continue
                self._restarted_at = time.monotonic()
                self.restarts += 1
                self._down_reason = None
                log.warning(
                    "the vLLM engine is back: restarted in %.1f s (%.1f s after it died); restart %d",
                    self._restarted_at - start,
                    self._restarted_at - died_at,
                    self.restarts,
                )
                break

    async def _drain(self) -> None:
        """Let in-flight requests receive vLLM's EngineDeadError (UNAVAILABLE) before the loop blocks in the
        restart; whatever is still live after DRAIN_SECONDS is cancelled (also UNAVAILABLE)."""
        deadline = time.monotonic() + DRAIN_SECONDS
        while self._live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with self._live_lock:
            leftovers = [live.task for live in self._live.values() if live.task is not None]
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.gather(*leftovers, return_exceptions=True)

    def _replace_llm(self) -> None:
        """Blocks the engine loop for the restart (seconds): nothing else can run on it meanwhile, and submit()
        refuses new requests with `_down_reason` from the callers' threads, so no request waits on it."""
        old, self._llm = self._llm, None
        with contextlib.suppress(Exception):  # vLLM already shut the dead client down; free what is left
            old.shutdown()
        del old
        unfreeze_heap()  # the dead engine's objects were frozen with the startup heap (core/gc_heap.py)
        gc.collect()
        self._llm = self._new_llm()
        freeze_startup_heap()

    def shutdown(self) -> None:
        self._closing.set()
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=30)
        # Drop the engine before the interpreter goes, or AsyncLLM.__del__ logs a TypeError (docs/platform-notes.md E4).
        self._llm = None
        gc.collect()

    @property
    def errored(self) -> bool:
        return self._llm is None or bool(self._llm.errored)

    # Requests ----------------------------------------------------------------------------------------------

    def submit(
        self, request: EngineRequest, emit: Emit, is_cancelled: Callable[[], bool] | None, key: str = ""
    ) -> str | None:
        """Start generating; thread-safe, returns the request id at once (None if refused).

        `is_cancelled` (None: nothing to watch) is polled every CANCEL_POLL_SECONDS from a watcher thread, the
        live requests' probes side by side (never from the engine loop: on Triton each is an IPC round trip); when
        it turns true, or `cancel(id)` is called, the request is aborted in vLLM and gets a final Unavailable error.
        A non-empty `key` lets `cancel_key(key)` abort it.
        """
        if self._loop is None or self._llm is None or self.errored:
            reason = self._down_reason
            if reason is None and self._restart.restart_engine and not self._closing.is_set():
                reason = RESTARTING  # it died, and the supervisor has not seen it yet
            emit(None, Unavailable(reason or "the vLLM engine is not running"), True)
            return None
        request_id = f"triton-{next(self._ids)}"
        with self._live_lock:
            live = _Live(is_cancelled, _FinalOnce(emit), key)
            self._live[request_id] = live
            if key:
                self._keys[key] = request_id
                live.cancel_requested = self._early_aborts.pop(key, 0) is None
            wake = not self._arrivals
            self._arrivals.append((request_id, request, time.monotonic()))
        # Waking the loop is a write to its self-pipe, which releases the GIL; a busy stub's thread then waits up
        # to a switch interval to get it back. Measured on the H100: the core's execute took 2.4-7.4 ms for ~4
        # requests at 256 streams. One wake-up for everything that arrives before the loop takes it in.
        if wake:
            self._loop.call_soon_threadsafe(self._intake)
        return request_id

    def _intake(self) -> None:
        with self._live_lock:
            arrivals, self._arrivals = self._arrivals, []
        for request_id, request, submitted in arrivals:
            self._start_task(request_id, request, submitted)

    def _start_task(self, request_id: str, request: EngineRequest, submitted: float) -> None:
        with self._live_lock:
            live = self._live.get(request_id)
        if live is None:
            return
        live.task = asyncio.ensure_future(self._generate(request_id, request, live.emit, submitted))
        if live.cancel_requested:
            live.task.cancel()
        live.task.add_done_callback(lambda _: self._finish(request_id))

    def _finish(self, request_id: str) -> None:
        with self._live_lock:
            live = self._live.pop(request_id, None)
            if live is not None and live.key:
                self._keys.pop(live.key, None)
        if live is not None and not live.emit.done:  # cancelled before its first step: still owes a final
            live.emit(None, Unavailable("the request was cancelled"), True)

    def cancel(self, request_id: str) -> None:
        """Abort one request (thread-safe): its task is cancelled, which aborts it in vLLM."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_on_loop, request_id)

    def cancel_key(self, key: str) -> bool:
        """Abort the request submitted with this key (thread-safe); False if none is running yet.

        A key not seen yet is remembered (bounded), so a request whose abort overtook it is aborted on arrival.
        """
        with self._live_lock:
            request_id = self._keys.get(key)
            if request_id is None:
                self._early_aborts[key] = None
                while len(self._early_aborts) > EARLY_ABORTS_KEPT:
                    self._early_aborts.pop(next(iter(self._early_aborts)))
                return False
        self.cancel(request_id)
        return True

    def _cancel_on_loop(self, request_id: str) -> None:
        with self._live_lock:
            live = self._live.get(request_id)
        if live is None:
            return
        live.cancel_requested = True
        if live.task is not None:
            live.task.cancel()

    def _watch_cancellations(self) -> None:
        probes: ThreadPoolExecutor | None = None  # started with the first request that has a probe
        while not self._closing.wait(CANCEL_POLL_SECONDS):
            with self._live_lock:
                live = [
                    (request_id, item.is_cancelled)
                    for request_id, item in self._live.items()
                    if item.is_cancelled is not None and not item.cancel_requested
                ]
            if not live:
                continue
            if probes is None:
                probes = ThreadPoolExecutor(PROBE_THREADS, thread_name_prefix="vllm-cancel-probe")
            # Side by side: on Triton each probe is an IPC round trip that queues behind the stub's responses
            # (~0.3 s each measured in a busy stub), so one sweep after the other would outlast the poll many times.
            for (request_id, _), cancelled in zip(live, probes.map(_probe, (probe for _, probe in live)), strict=True):
                if cancelled:
                    log.info("request %s: cancelled by the client", request_id)
                    self.cancel(request_id)
        if probes is not None:
            probes.shutdown(wait=False)

    def _sampling_params(self, request: EngineRequest) -> Any:
        return sampling_params(request, offload_detokenization=self._sync_ids is not None)

    def _lora_request(self, name: str | None) -> Any:
        check_lora(name, self._lora_adapters)
        if name is None:
            return None
        from vllm.lora.request import LoRARequest

        lora_id = sorted(self._lora_adapters).index(name) + 1
        return LoRARequest(name, lora_id, self._lora_adapters[name])

    async def _generate(self, request_id: str, request: EngineRequest, emit: Emit, submitted: float) -> None:
        finished, first = False, True
        try:
            sampling = self._sampling_params(request)
            lora = self._lora_request(request.lora_name)
            if request.prompt_token_ids is not None:
                prompt: Any = {"prompt_token_ids": request.prompt_token_ids}
            elif request.prompt is not None:
                prompt = {"prompt": request.prompt}
            else:
                raise InvalidInput("engine_request: neither prompt_token_ids nor prompt")
            if request.images:
                prompt["multi_modal_data"] = {"image": [rgb_image(doc) for doc in request.images]}
            self._in_flight.add(request_id)
            windows, decode, last = None, None, {}
            async for output in self._llm.generate(prompt, sampling, request_id, lora_request=lora):
                finished = output.finished
                if self._lags is not None:
                    self._lags.output(getattr(output, "metrics", None), submitted, first, finished)
                    first = False
                if not sampling.detokenize and windows is None:
                    windows = TokenWindows(output.prompt_token_ids, self._sync_ids, sampling.logprobs is not None)
                    decode = decode_options(sampling)
                response = to_engine_response(
                    output, request.postprocess_options, windows, decode, streamed=request.stream
                )
                if sampling.n > 1:
                    every_sequence(response, sampling.n, last, sampling.logprobs is not None)
                emit(response, None, finished)
            # No return at the finished output: vLLM's generator then ends by itself. One left suspended there is
            # closed by the event loop's async-generator finalizer (a self-pipe write, a task, and vLLM's abort path
            # for a request it has already forgotten): per request, on the loop that takes the next wave in.
            if not finished:  # the stream ended without a final output (aborted)
                emit(None, Unavailable("the request was aborted by the engine"), True)
        except InvalidInput as exc:
            emit(None, exc, True)
        except client_errors() as exc:  # vLLM's own input validation (prompt too long, bad token ids, ...)
            emit(None, InvalidInput(str(exc)), True)
        except asyncio.CancelledError:
            emit(None, Unavailable("the request was cancelled"), True)
            raise
        except Exception as exc:  # noqa: BLE001 - engine died or failed: the client must hear of it
            log.exception("request %s failed", request_id)
            emit(None, Unavailable(f"the vLLM engine failed: {exc}"), True)
        finally:
            self._in_flight.discard(request_id)
            if not finished:
                with contextlib.suppress(Exception):
                    await self._llm.abort(request_id)
