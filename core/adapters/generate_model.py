"""The plain path's BLS model: each request on its own worker thread, the core called by BLS."""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import triton_python_backend_utils as pb_utils

from core.adapters.common import (
    CODE_TAG_PARAMETER,
    CoreResponses,
    GuardedSender,
    child_error,
    document_tensor,
    triton_error,
    version_dir,
)
from core.gc_heap import freeze_startup_heap
from core.interface import ENGINE_REQUEST, ENGINE_RESPONSE, InvalidInput, Unavailable
from core.protocol import whole_answer
from core.settings import GenerateSettings, load_settings


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
        self.settings = load_settings(self.SETTINGS, version_dir(args))
        self.core_model = self.settings.core_model
        self.pool = ThreadPoolExecutor(max_workers=self.settings.max_in_flight, thread_name_prefix="generate")
        self._graveyard: deque[tuple[float, Any]] = deque()
        self._graveyard_lock = threading.Lock()
        freeze_startup_heap()  # core/gc_heap.py

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
            response = pb_utils.InferenceResponse(error=triton_error(exc))
        sender.send(response, flags=final)

    def _generate(self, request: Any, sender: Any) -> Any:
        engine_request = pb_utils.get_input_tensor_by_name(request, ENGINE_REQUEST.name)
        if engine_request is None:
            raise InvalidInput(f"{ENGINE_REQUEST.name} is missing")
        iterator = self._core_request(engine_request, {CODE_TAG_PARAMETER: True}).exec(decoupled=True)
        responses = CoreResponses(iterator)
        deltas = [array.reshape(-1)[0] for array in responses]  # encoded: a lone whole answer is not decoded here
        self._release(iterator, sender)
        if responses.error is not None:
            return pb_utils.InferenceResponse(error=child_error(responses.error))
        if not deltas:
            raise Unavailable(f"{self.core_model} returned no response")
        return pb_utils.InferenceResponse(output_tensors=[document_tensor(ENGINE_RESPONSE, whole_answer(deltas))])

    def _core_request(self, engine_request: Any, parameters: dict[str, Any]) -> Any:
        """A BLS request to the core: one engine request (or a control request), its ENGINE_RESPONSE asked for."""
        return pb_utils.InferenceRequest(
            model_name=self.core_model,
            inputs=[engine_request],
            requested_output_names=[ENGINE_RESPONSE.name],
            parameters=parameters,
        )

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
