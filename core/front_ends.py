"""Several front ends for one vLLM engine: the core's instances share one EngineCore (deployment key
`core.front_ends`).

A front end is vLLM's AsyncLLM client: it takes requests in, turns the EngineCore's outputs into RequestOutputs
and hands them to the core's sender threads, all on the core stub's one interpreter. On an H100 at 256 streams
that interpreter was the limit (the stub at one full CPU while streaming; docs/performance-gpu.md). With N front
ends the core model has N Triton instances, each its own stub process with its own AsyncLLM client, all attached
to one EngineCore that instance 0 launches: the arrangement of `vllm serve --api-server-count N` (one engine, N
API-server processes, each a client with its own ZMQ input and output socket).

The sockets are IPC paths named after the server (tritonserver, every stub's parent) and the model, so every
instance knows them without talking to the others. Each client binds its own pair and the EngineCore connects to
all of them, so the instances may come up in any order: instance 0 launches the engine, every instance (0 too)
then waits for the engine's READY on its own sockets.

vLLM's client notices its engine's death only when it launched it; the others would wait forever on a dead
socket. Instance 0 writes the EngineCore's process ids next to the sockets, and every instance watches them
(`watch_engine`): a death fails the requests in flight with UNAVAILABLE, as with one front end.

Metrics: Triton gives the core's instances one metric per name and labels, so counters and histograms add up over
the front ends; vLLM hands each step's scheduler statistics (the gauges) to one front end, and the front ends set
the shared gauges newest-first (core/metrics.py GaugeClock, a file next to the sockets).

What one engine for several processes cannot do: restart. A client attaches once (vLLM's EngineCore greets each
client socket once, at its start), so a restarted engine would need every instance to rebuild its client; the
settings therefore require `health.restart_engine: false` with front_ends > 1 (core/settings.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.engine_config import serving_usage_context

# tritonserver's instance names: "<group name>_<index in the group>"; the renderer writes one group (the default
# group name is "<model>_<group index>", so the core's instances are "vllm_core_0_0", "vllm_core_0_1", ...).
_INSTANCE_INDEX = re.compile(r"_(\d+)$")
PIDS_FILE = "engine-pids"  # front end 0: the running EngineCore's process ids
FAILED_FILE = "engine-failed"  # front end 0: why the engine did not start
GAUGE_CLOCK_FILE = "gauges-at"  # every front end: when the shared gauges were last set (core/metrics.py)
WATCH_SECONDS = 0.25
ENGINE_EXIT_SECONDS = 10.0  # front end 0's stop waits this long at most for the EngineCore's processes to end


@dataclass(frozen=True)
class FrontEnd:
    """This process's place among the core's front ends, and where their sockets live."""

    index: int
    count: int
    socket_dir: Path

    @property
    def launches_engine(self) -> bool:
        return self.index == 0

    def input_address(self, index: int) -> str:
        return f"ipc://{self.socket_dir / f'in-{index}'}"

    def output_address(self, index: int) -> str:
        return f"ipc://{self.socket_dir / f'out-{index}'}"

    def client_addresses(self) -> dict[str, str]:
        """AsyncLLM's `client_addresses` for this front end."""
        return {"input_address": self.input_address(self.index), "output_address": self.output_address(self.index)}

    @property
    def gauge_clock_path(self) -> Path:
        return self.socket_dir / GAUGE_CLOCK_FILE

    def describe(self) -> str:
        return f"front end {self.index} of {self.count}"


def instance_index(instance_name: str) -> int:
    """The index of a Triton model instance within its group, from its name (ValueError if it has none)."""
    match = _INSTANCE_INDEX.search(instance_name)
    if match is None:
        raise ValueError(f"cannot tell the instance index from the instance name {instance_name!r}")
    return int(match.group(1))


def front_end(
    count: int, instance_name: str, model_name: str, server_pid: int | None = None, first: int = 0
) -> FrontEnd | None:
    """This instance's FrontEnd, or None with a single front end (the core then starts its engine as vLLM does).
    `count`: the engine's front ends over all models; `model_name`: the model whose instance 0 launches the engine;
    `first`: the index of this model's instance 0 (entry: plain-core's plain model: after the core's)."""
    if count <= 1:
        return None
    index = first + instance_index(instance_name)
    if index >= count:
        raise ValueError(f"instance {instance_name!r} is front end {index}, but the engine has {count}")
    pid = os.getppid() if server_pid is None else server_pid
    # Short: an IPC path must fit a Unix socket's 107 bytes.
    socket_dir = Path(tempfile.gettempdir()) / f"tvllm-fe-{pid}-{model_name}"
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    return FrontEnd(index, count, socket_dir)


class LaunchedEngine:
    """The EngineCore process(es) instance 0 launched for every front end; `shutdown` ends them."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self.pids = [proc.pid for proc in getattr(manager, "processes", [])]

    def shutdown(self) -> None:
        """Stop the EngineCore and wait (ENGINE_EXIT_SECONDS at most) until its processes have ended: vLLM's manager
        may return while the EngineCore still tears down (seconds on CPU, its executor's workers), and the other
        front ends, finalized after this one, should find the engine gone rather than going."""
        if self._manager is not None:
            with contextlib.suppress(Exception):
                self._manager.shutdown()
            self._manager = None
            deadline = time.monotonic() + ENGINE_EXIT_SECONDS
            while any(_alive(pid) for pid in self.pids) and time.monotonic() < deadline:
                time.sleep(0.05)


def vllm_config(engine_args: dict[str, Any]) -> tuple[Any, Any]:
    """vLLM's config and executor class for these engine args (built once per front end: launch and client)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.executor import Executor

    config = AsyncEngineArgs(**engine_args).create_engine_config(serving_usage_context())
    return config, Executor.get_class(config)


def launch_engine(config: Any, executor: Any, fe: FrontEnd, log_stats: bool) -> LaunchedEngine:
    """Start the EngineCore for all `fe.count` front ends and wait until it is up (its clients need not be)."""
    from vllm.v1.engine.utils import EngineZmqAddresses, launch_core_engines

    addresses = EngineZmqAddresses(
        inputs=[fe.input_address(i) for i in range(fe.count)],
        outputs=[fe.output_address(i) for i in range(fe.count)],
    )
    # A context manager in both supported releases: the processes start on entry, the startup handshake runs on
    # exit. It yields a 4-tuple (manager, coordinator, addresses, tensor queue) in vLLM 0.26, an object with
    # `engine_manager` in 0.32.
    with launch_core_engines(config, executor, log_stats, addresses) as launched:
        manager = launched[0] if isinstance(launched, tuple) else launched.engine_manager
    return LaunchedEngine(manager)


def stats_logged(engine_args: dict[str, Any], stat_loggers: list[Any] | None) -> bool:
    """vLLM's own rule (AsyncLLM): statistics on when asked for, or when a stat logger wants them. The EngineCore
    makes the scheduler's (the gauges) only when launched with them on."""
    return not engine_args.get("disable_log_stats", False) or bool(stat_loggers)


def requests_logged(engine_args: dict[str, Any]) -> bool:
    """A log line per request only with the engine arg `enable_log_requests` (vLLM's default off), as vLLM's
    engine-args path decides. AsyncLLM's own constructor defaults to on, which logged a line for every request in
    every front end (measured on the H100: 16,640 lines in one benchmark command)."""
    return bool(engine_args.get("enable_log_requests", False))


def attach_client(
    config: Any, executor: Any, fe: FrontEnd, stat_loggers: list[Any] | None, engine_args: dict[str, Any]
) -> Any:
    """This front end's AsyncLLM, a client of the shared EngineCore (blocks until the engine greets it); its
    logging as `engine_args` ask."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM(
        config,
        executor,
        log_stats=stats_logged(engine_args, stat_loggers),
        log_requests=requests_logged(engine_args),
        stat_loggers=stat_loggers,
        client_addresses=fe.client_addresses(),
        client_count=fe.count,
        client_index=fe.index,
    )


def clear_published(fe: FrontEnd) -> None:
    """Instance 0, before a launch and at shutdown: what an earlier engine of this model published is void."""
    for name in (PIDS_FILE, FAILED_FILE):
        with contextlib.suppress(FileNotFoundError):
            (fe.socket_dir / name).unlink()


def _publish(fe: FrontEnd, name: str, text: str) -> None:
    staged = fe.socket_dir / f"{name}.{os.getpid()}"
    staged.write_text(text, encoding="utf-8")
    staged.replace(fe.socket_dir / name)  # whole or not at all, for the readers


def publish_engine_pids(fe: FrontEnd, pids: list[int]) -> None:
    """Instance 0: tell the other front ends the engine is up, and which processes to watch."""
    _publish(fe, PIDS_FILE, " ".join(map(str, pids)) + "\n")


def publish_launch_failure(fe: FrontEnd, error: BaseException) -> None:
    """Instance 0: the engine did not start; the other front ends fail their load with this instead of waiting."""
    _publish(fe, FAILED_FILE, f"{type(error).__name__}: {error}\n")


def engine_stopped(fe: FrontEnd) -> bool:
    """Whether front end 0 withdrew the engine it had published (it does so before stopping it)."""
    return not (fe.socket_dir / PIDS_FILE).exists()


async def end_output_handler(llm: Any) -> None:
    """Cancel an AsyncLLM client's output handler, then fail its requests in flight with EngineDeadError (what the
    handler does when its engine's socket fails, without the handler's error log and traceback). For a client whose
    engine front end 0 ended on purpose: at every stop of the server each other front end logged that end as
    `AsyncLLM output_handler failed` with a traceback (measured on the H100: three in every benchmark command)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    handler = getattr(llm, "output_handler", None)
    if handler is not None and not handler.done():
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handler
    llm.output_processor.propagate_error(EngineDeadError())


def read_engine_pids(fe: FrontEnd, wait_seconds: float) -> list[int]:
    """The running EngineCore's process ids as instance 0 published them (ids of processes that have ended are
    an earlier engine's); RuntimeError if the launch failed or nothing came within `wait_seconds`."""
    deadline = time.monotonic() + wait_seconds
    while True:
        failed = fe.socket_dir / FAILED_FILE
        if failed.exists():
            reason = failed.read_text(encoding="utf-8").strip()
            raise RuntimeError(f"{fe.describe()}: front end 0 could not start the engine: {reason}")
        with contextlib.suppress(OSError, ValueError):
            pids = [int(word) for word in (fe.socket_dir / PIDS_FILE).read_text(encoding="ascii").split()]
            if pids and all(_alive(pid) for pid in pids):
                return pids
        if time.monotonic() > deadline:
            raise RuntimeError(f"{fe.describe()}: the engine front end 0 launches was not up in {wait_seconds:.0f} s")
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A dead child of this process stays a zombie until reaped: alive to kill(0), not to /proc's state.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    return True


def watch_engine(pids: list[int], on_death: Callable[[int], None], stop: threading.Event) -> threading.Thread:
    """Call `on_death(pid)` once, from a daemon thread, when any of `pids` has ended (unless `stop` is set first)."""

    def watch() -> None:
        while not stop.wait(WATCH_SECONDS):
            for pid in pids:
                if not _alive(pid):
                    on_death(pid)
                    return

    thread = threading.Thread(target=watch, name="vllm-engine-watch", daemon=True)
    thread.start()
    return thread
