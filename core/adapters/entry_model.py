"""The `entry: bls` public models: the stages in-process and the core by BLS, so a client's cancel reaches the
engine."""

from __future__ import annotations

import json
import threading
import time
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from core.adapters.common import (
    ABORT_PARAMETER,
    CANCEL_KEY_PARAMETER,
    CODE_TAG_PARAMETER,
    CoreResponses,
    LoadedStage,
    child_error,
    document_tensor,
    request_parameters,
    triton_error,
    version_dir,
)
from core.adapters.generate_model import GenerateModel
from core.gc_heap import freeze_startup_heap
from core.interface import ENGINE_REQUEST, ENGINE_RESPONSE, InvalidInput, Unavailable
from core.protocol import whole_answer
from core.settings import STAGES_FILE, EntrySettings


class EntryModel(GenerateModel):
    """A public entry that is not an ensemble: preprocess and postprocess stages run in-process, the core by BLS.

    Why (docs/platform-notes.md T5, measured on Triton 2.51): a client's cancel (gRPC stream cancel, SSE disconnect,
    plain-request timeout) reaches only the top-level model of its request. Inside an ensemble no step sees
    it (`is_cancelled()` stays false, `send` keeps succeeding), and a BLS iterator has no `cancel()`. This
    model is the top level, so a watcher thread polls each request's `is_cancelled()` and aborts its core
    request with a control request carrying the request's cancel key. settings.json's `stream` makes it the
    decoupled streaming entry (one response per delta) or the plain one (one merged response); `watch_cancels`
    false (entry: plain-bls) leaves the watcher out: the plain path's stages in-process, without the probes.
    """

    CANCEL_POLL_SECONDS = 0.25
    SETTINGS = EntrySettings

    def initialize(self, args: dict[str, Any]) -> None:
        super().initialize(args)
        self.streaming = self.settings.stream
        spec = json.loads((version_dir(args) / STAGES_FILE).read_text())
        repository_root = Path(args["model_repository"]).parent
        self.stages = {role: LoadedStage(spec[role], repository_root) for role in ("preprocess", "postprocess")}
        self._live: dict[str, Any] = {}  # cancel key -> response sender, for the watcher
        self._live_lock = threading.Lock()
        self._closing = threading.Event()
        self.watching = self.settings.watch_cancels
        if self.watching:
            self._probes = ThreadPoolExecutor(max_workers=32, thread_name_prefix="entry-cancel-probe")
            self._watcher = threading.Thread(target=self._watch, name="entry-cancel-watch", daemon=True)
            self._watcher.start()
        freeze_startup_heap()  # again: the stages loaded after generate's part (core/gc_heap.py)

    def _run_stage(self, role: str, inputs: dict[str, Any], parameters: dict[str, Any]) -> list[Any]:
        return self.stages[role].run(inputs, parameters)

    def _serve(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            self._entry(request, sender)
        except Exception as exc:  # noqa: BLE001 - one bad request must not take the model down
            if not isinstance(exc, (InvalidInput, Unavailable)):
                self.logger.log_error(f"entry failed: {traceback.format_exc()}")
            sender.send(pb_utils.InferenceResponse(error=triton_error(exc)), flags=final)

    def _entry(self, request: Any, sender: Any) -> None:
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        inputs = self.stages["preprocess"].inputs_of(request)
        (engine_request,) = self._run_stage("preprocess", inputs, request_parameters(request))
        key = f"{uuid.uuid4().hex}"
        child = self._core_request(
            engine_request, {CANCEL_KEY_PARAMETER: key} if self.watching else {CODE_TAG_PARAMETER: True}
        )
        if self.watching:
            with self._live_lock:  # before exec: a cancel that comes while exec waits must be seen too
                self._live[key] = sender
        try:
            iterator = child.exec(decoupled=True)
            responses = CoreResponses(iterator)
            deltas: list[bytes] = []  # encoded, as generate keeps them
            last: list[Any] | None = None  # a stream's last outputs: sent with FINAL after the release barrier
            abandoned = False
            for array in responses:
                if self.streaming:
                    if abandoned:
                        continue  # drain the core's remaining responses; the abort is on its way
                    outputs = self._run_stage("postprocess", {ENGINE_RESPONSE.name: array}, {})
                    if responses.finished:
                        last = outputs
                        continue
                    try:
                        sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
                    except Exception:  # noqa: BLE001 - the client is gone (a cancelled stream refuses sends)
                        abandoned = True
                        if self._claim(key):
                            self._abort([key], sender)
                else:
                    deltas.append(array.reshape(-1)[0])
        finally:
            with self._live_lock:
                self._live.pop(key, None)
        self._release(iterator, sender)
        if abandoned or sender.closed:
            return
        if responses.error is not None:
            sender.send(pb_utils.InferenceResponse(error=child_error(responses.error)), flags=final)
            return
        if self.streaming:
            # docs/platform-notes.md T8: the last data travels with FINAL (a bare FINAL only if the core sent none)
            sender.send(None if last is None else pb_utils.InferenceResponse(output_tensors=last), flags=final)
            return
        if not deltas:
            raise Unavailable(f"{self.core_model} returned no response")
        merged = np.array([whole_answer(deltas)], dtype=np.object_)
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
        control = self._core_request(document_tensor(ENGINE_REQUEST, "{}"), {ABORT_PARAMETER: ",".join(keys)})
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
