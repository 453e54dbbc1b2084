"""What the core, generate and entry adapters read from a rendered repository: one typed model per consumer.

The renderer (repo_render/repository.py) writes `settings.json` next to each of these models' model.py from the
models below, and the adapters (core/adapters/) read it back with `model_validate_json`. Every default and
bound of these settings lives here only: the deployment schema (repo_render/schema.py) takes `metrics`,
`engine_env`, `stream_interval_ms`, `health` and `core` from CoreSettings, and the engine's RestartPolicy is
HealthSettings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

SETTINGS_FILE = "settings.json"
# A stage model's class and settings (next to its model.py), and those of the stages an entry model or the core
# runs in-process: {"preprocess": ..., "postprocess": ...}, each entry as in stage.json.
STAGE_FILE = "stage.json"
STAGES_FILE = "stages.json"


class Settings(BaseModel):
    # strict: a "3" is not an int and a 1 is not a bool (as in the YAML the deployment author wrote); forbid: a
    # misspelt key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HealthSettings(Settings):
    """What the core does when vLLM's engine dies (its EngineCore process crashes or is killed); deployment key
    `health`. Triton 2.51's Python backend cannot mark a model not ready, so without a restart the core answers
    UNAVAILABLE forever.

    Restart k (1-based, counted among restarts in a row that did not hold: the start failed, or the engine died
    again within core.engine.STABLE_SECONDS) waits restart_backoff_seconds * 2**(k-1); after max_restarts of them
    the core gives up and stays UNAVAILABLE, so a crash loop (e.g. a model that kills its EngineCore on every load)
    does not spin.
    """

    restart_engine: bool = True
    max_restarts: int = Field(3, ge=1, json_schema_extra={"hint": "to never restart, set health.restart_engine: false"})
    restart_backoff_seconds: float = Field(1.0, ge=0, le=3600)


class CoreProcessSettings(Settings):
    """The core's own process: how it sends its responses and where its engine runs; deployment key `core`."""

    # Threads that send the core's responses to Triton; each send is a round trip to tritonserver, so several
    # threads keep several in flight (a request stays on one thread: its responses keep their order).
    sender_threads: int = Field(1, ge=1, le=64)
    # Python's GIL switch interval in the core's stub, in ms (0: Python's default, 5 ms). A thread back from an
    # IPC wait waits up to this long for the GIL while the engine loop computes.
    switch_interval_ms: float = Field(0.0, ge=0, le=100)
    # CPUs for the main threads of vLLM's engine processes (the EngineCore's busy loop, tensor-parallel workers);
    # their other threads and the server's other processes are kept off them (core/cpu_placement.py). Empty: no
    # placement. Linux only.
    engine_cpus: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    # The core's Triton instances, each a front end (vLLM's AsyncLLM client, in its own stub process) of one shared
    # EngineCore, as `vllm serve --api-server-count` (core/front_ends.py): intake, output handling and sending
    # spread over this many interpreters. 1: one process does all of it.
    front_ends: int = Field(1, ge=1, le=16)
    # The streaming ensemble's postprocess stage runs in the core's sender threads (in-process, the same class and
    # settings as the postprocess model) instead of as its own Triton model: one Python-backend round trip less
    # per streamed delta. The core then takes one request per execute: its outputs are the ensemble's public,
    # unbatched outputs, which a batching model cannot produce.
    postprocess_in_sender: bool = False
    # Threads (per front end) on which the core runs the streaming ensemble's preprocess stage (in-process, the
    # same class and settings as the preprocess model) instead of the preprocess model: one Python-backend round
    # trip less before the engine sees a streamed request. Tokenizing releases the GIL, so a burst of requests is
    # tokenized side by side, as by the preprocess model's instances. 0: the preprocess model does it. The core
    # then takes one request per execute (its inputs are the ensemble's public, unbatched inputs).
    preprocess_threads: int = Field(0, ge=0, le=64)
    # vLLM's EngineCore keeps back each request's per-token outputs until its client reads them (core/engine_hold.py):
    # a non-streamed (FINAL_ONLY) request's after its first token until it ends, a streamed one's between vLLM's
    # stream_interval tokens; a front end then wakes for one message a request instead of one a token.
    hold_outputs_in_engine: bool = False


class CoreSettings(Settings):
    """The core model's settings.json (the engine's own arguments are model.json)."""

    metrics: bool = False  # publish vLLM's stats as Triton custom metrics
    # Environment variables for the engine's process, set by the core before vLLM starts (the EngineCore inherits
    # them): vLLM's own knobs that are not engine args, e.g. OMP_NUM_THREADS or VLLM_CPU_OMP_THREADS_BIND.
    engine_env: dict[str, str] = Field(default_factory=dict)
    # A stream's deltas of one request are sent at most once per this many ms (merged; the first and the final
    # never wait). 0: every delta as soon as the core's sender is free (queued ones still merge).
    stream_interval_ms: int = Field(0, ge=0, le=1000)
    health: HealthSettings = Field(default_factory=HealthSettings)
    core: CoreProcessSettings = Field(default_factory=CoreProcessSettings)

    @model_validator(mode="after")
    def _shared_engine_limits(self) -> CoreSettings:
        problem = shared_engine_problem(self, self.core.front_ends, "core.front_ends > 1")
        if problem:
            raise ValueError(problem)
        return self


def shared_engine_problem(settings: CoreSettings, clients: int, why: str) -> str | None:
    """What one engine with several front ends (`clients` of them, `why` they are several) cannot do yet
    (core/front_ends.py says why), or None."""
    if clients <= 1:
        return None
    if settings.health.restart_engine:
        return f"{why} shares one engine between processes, which cannot restart it: set health.restart_engine: false"
    if settings.engine_env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        return (
            f"{why} needs vLLM's EngineCore in its own process: remove engine_env.VLLM_ENABLE_V1_MULTIPROCESSING: '0'"
        )
    return None


class EngineClients(Settings):
    """The front ends of one EngineCore across models (written by the renderer, not a deployment key): with entry:
    plain-core the plain public model's instances are front ends of the core's engine too."""

    engine_model: str  # the model whose instance 0 launches the EngineCore: the front ends' sockets are named after it
    first: int = Field(ge=0)  # this model's instance i is front end first + i
    total: int = Field(ge=1)  # front ends of the one EngineCore, over all models


class CoreModelSettings(CoreSettings):
    """What a model running the core's adapter reads (settings.json): the core, or with entry: plain-core also the
    plain public model, which is the core's adapter with the stages in-process and one response per request."""

    # None: this model's own front ends only (core.front_ends of them, named after this model)
    engine_clients: EngineClients | None = None
    # The plain public model (entry: plain-core): every request through the preprocess stage on the core's threads
    # and the postprocess stage in its senders, answered with one response (vLLM's FINAL_ONLY output).
    plain: bool = False
    # The plain public model only (generate.watch_cancels): probe each request's sender for the client's cancel (the
    # engine's watcher, every CANCEL_POLL_SECONDS) and abort its engine request. The core's own requests are ensemble
    # steps or BLS children, where Triton 2.51 never shows a cancel.
    watch_cancels: bool = False

    @model_validator(mode="after")
    def _shared_engine_across_models(self) -> CoreModelSettings:
        if self.engine_clients is not None:
            problem = shared_engine_problem(self, self.engine_clients.total, "entry: plain-core")
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _cancels_watched_by_the_plain_model_only(self) -> CoreModelSettings:
        if self.watch_cancels and not self.plain:
            raise ValueError("watch_cancels is the plain model's (plain: true): the core's requests show no cancel")
        return self

    def clients_of(self, model_name: str) -> EngineClients:
        """The front ends of the engine this model serves: its own (`core.front_ends`, named after it) unless the
        renderer wrote them (the core's, for entry: plain-core)."""
        return self.engine_clients or EngineClients(engine_model=model_name, first=0, total=self.core.front_ends)


class GenerateSettings(Settings):
    """The generate model's settings.json. No defaults: the deployment schema owns them (generate.max_in_flight,
    names.core) and the renderer always writes both."""

    core_model: str  # the core's model name, called by BLS
    max_in_flight: int = Field(ge=1)  # worker threads: requests served at once


class EntrySettings(GenerateSettings):
    """A public entry model's settings.json (entry: bls, and the plain one of entry: plain-bls)."""

    stream: bool  # the decoupled streaming entry (one response per delta) or the plain one
    # Poll each request's is_cancelled() and abort its engine request by key (entry: bls). Off for entry: plain-bls:
    # the probes are IPC round trips (they cost plain throughput at 256 streams on an H100), and a key lives in
    # one of the core's front ends.
    watch_cancels: bool


S = TypeVar("S", bound=Settings)


def load_settings(kind: type[S], model_dir: Path) -> S:
    """`model_dir/settings.json` as `kind`; a missing or stale file fails the model's load, naming the file."""
    path = Path(model_dir) / SETTINGS_FILE
    try:
        return kind.model_validate_json(path.read_text(encoding="ascii"))
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{path}: cannot read {kind.__name__} (re-render the repository?): {exc}") from exc
