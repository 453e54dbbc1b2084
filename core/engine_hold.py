"""Per-token outputs held inside vLLM's EngineCore until the request's client needs them.

vLLM's EngineCore sends every request's new token to its client (a front end) after every step, and each front end
with a request in the step wakes to take it in, whatever the request asked for: a FINAL_ONLY request (the plain
public model's) is answered once, at its end, and a streamed one with vLLM's `stream_interval` N > 1 is handed on
every N tokens. On the H100 at 16 streams the EngineCore's output thread (which encodes and sends each client's
message, holding the interpreter lock its busy loop needs) had 10 % of that loop's samples with the plain model's 8
front ends against 4 % with one client, and the server spent twice `vllm serve`'s CPU per token
(docs/performance-gpu.md, session 72).

`OutputHolder.keeps` takes one client's message of a step's outputs, as the EngineCore's scheduler made it
(`filter`: a whole step's, by client), and keeps back what nobody reads yet: after a request's first output (sent at
once: it carries the first token vLLM's front end times TTFT by, and the prefill statistics), its next outputs are
merged into one that goes when it ends (FINAL_ONLY), when N tokens have gathered (streamed), or as soon as an output
carries anything besides new token ids. A client whose outputs are all held gets no message that step. vLLM's front
end then builds the same RequestOutputs from fewer, longer outputs, as it does for speculative decoding's several
tokens a step.

Requests whose outputs must be seen each step are never held: logprobs or prompt logprobs (per-token data),
stop strings (vLLM's front end finds them in the text and aborts the request), pooling. Triton-free and vLLM-free
at import (core/engine_hold_install.py puts it in the EngineCore); unit tests drive it with vLLM's own output structs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

# The fields of vLLM's EngineCoreOutput (0.26's and 0.32's) that this module knows. Any other field could carry
# per-step data a merged output would lose, so a vLLM with another field is not held at all (`known_fields`).
KNOWN_OUTPUT_FIELDS = frozenset(
    {
        "request_id",
        "new_token_ids",
        "new_logprobs",
        "new_prompt_logprobs_tensors",
        "pooling_output",
        "finish_reason",
        "stop_reason",
        "events",
        "kv_transfer_params",
        "ec_transfer_params",
        "trace_headers",
        "prefill_stats",
        "routed_experts",
        "num_nans_in_logits",
        "mm_cache_miss_hashes",
        "new_sampling_mask",
        "spec_decode_metrics",
        "prompt_token_id_logprobs",
    }
)
# EngineCoreOutputs' fields that are the message's envelope, not content: a message with no outputs left and
# nothing but these is not sent.
ENVELOPE_FIELDS = frozenset({"engine_index", "outputs", "timestamp", "weight_version"})
KNOWN_MESSAGE_FIELDS = ENVELOPE_FIELDS | {
    "scheduler_stats",
    "utility_output",
    "finished_requests",
    "wave_complete",
    "start_wave",
}
# How often (in messages) the held state of requests the scheduler no longer has (aborted) is dropped
CLEANUP_MESSAGES = 1024


def known_fields(output_type: type, message_type: type) -> bool:
    """Whether this vLLM's EngineCoreOutput and EngineCoreOutputs have only the fields this module knows."""
    return (
        set(output_type.__struct_fields__) <= KNOWN_OUTPUT_FIELDS
        and set(message_type.__struct_fields__) <= KNOWN_MESSAGE_FIELDS
    )


def hold_interval(request: Any, stream_interval: int) -> float | None:
    """How many tokens a request's outputs may gather before they go (math.inf: until it ends), or None: never held."""
    params = getattr(request, "sampling_params", None)
    if params is None or getattr(request, "pooling_params", None) is not None:
        return None
    if params.logprobs is not None or params.prompt_logprobs is not None or params.stop:
        return None
    from vllm.sampling_params import RequestOutputKind

    if params.output_kind == RequestOutputKind.FINAL_ONLY:
        return math.inf
    return stream_interval if stream_interval > 1 else None


# The fields a held request's not-finished output may carry per step, each None when it carries nothing (and
# num_nans_in_logits, 0): the rest of KNOWN_OUTPUT_FIELDS is the request's own (its id, what every output repeats),
# never set for a request that is held (logprobs, prompt logprobs, pooling: hold_interval) or set only on its first
# output (prompt logprobs) or its finished one (kv_transfer_params), which are never held.
PER_STEP_FIELDS = (
    "events",
    "prefill_stats",
    "ec_transfer_params",
    "routed_experts",
    "mm_cache_miss_hashes",
    "new_sampling_mask",
    "spec_decode_metrics",
)
# EngineCoreOutputs' content besides its outputs, each None (or empty) when there is none
MESSAGE_CONTENT_FIELDS = tuple(sorted(KNOWN_MESSAGE_FIELDS - ENVELOPE_FIELDS))


def _per_step_check(output_type: type) -> Callable[[Any], bool]:
    """A test of whether an output of `output_type` carries nothing per step but its new token ids: one `and` chain
    of this vLLM's fields, compiled once (the EngineCore's output thread runs it for every held output of every step;
    a loop over the fields took four times as long)."""
    names = [name for name in PER_STEP_FIELDS if name in output_type.__struct_fields__]
    # `is None`, not `==`: some of these fields are arrays, whose == is elementwise. The names are this module's.
    return eval("lambda output: output.num_nans_in_logits == 0" + "".join(f" and output.{n} is None" for n in names))


def _has_content(message: Any) -> bool:
    """Whether a message with no outputs left still carries something (statistics, finished ids, a wave number)."""
    return any(getattr(message, name, None) not in (None, set()) for name in MESSAGE_CONTENT_FIELDS)


_UNSEEN = object()  # a request with no output sent yet


class _Held:
    __slots__ = ("interval", "token_ids")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.token_ids: list[int] = []


class OutputHolder:
    """One EngineCore's held outputs. `request_of(request_id)` gives the scheduler's request (None once it is gone);
    `stream_interval` is vLLM's (its scheduler config's)."""

    def __init__(self, request_of: Callable[[str], Any | None], stream_interval: int) -> None:
        self._request_of = request_of
        self._stream_interval = stream_interval
        # request id -> its held state, or None: seen, never held. Absent: no output sent yet.
        self._requests: dict[str, _Held | None] = {}
        self._messages = 0
        self.held = 0  # outputs held so far (merged into a later one)
        self._only_new_tokens: Callable[[Any], bool] | None = None  # for this vLLM's output type, from the first

    def __len__(self) -> int:
        return len(self._requests)

    def filter(self, outputs: dict[int, Any] | None) -> dict[int, Any] | None:
        """One step's outputs by client, with what is held taken out (in place); clients left with nothing dropped."""
        if outputs:
            for client in [client for client, message in outputs.items() if not self.keeps(message)]:
                del outputs[client]
        return outputs

    def keeps(self, message: Any) -> bool:
        """Take what is held out of one client's EngineCoreOutputs (in place); False: nothing is left to send."""
        self._messages += 1
        if self._messages % CLEANUP_MESSAGES == 0:
            self._forget_gone()
        if not message.outputs:
            return True
        message.outputs = self._kept(message.outputs)
        return bool(message.outputs) or _has_content(message)

    def _kept(self, step_outputs: list[Any]) -> list[Any]:
        kept = []
        requests = self._requests
        only_new_tokens = self._only_new_tokens
        held_now = 0
        for output in step_outputs:
            request_id = output.request_id
            held = requests.get(request_id, _UNSEEN)
            if held is None:  # never held
                if output.finish_reason is not None:
                    del requests[request_id]
            elif held is _UNSEEN:  # its first output (the first token): sent at once
                if output.finish_reason is None:
                    request = self._request_of(request_id)
                    interval = None if request is None else hold_interval(request, self._stream_interval)
                    requests[request_id] = None if interval is None else _Held(interval)
                    if only_new_tokens is None:
                        only_new_tokens = self._only_new_tokens = _per_step_check(type(output))
            elif (
                output.finish_reason is None
                and len(held.token_ids) + len(output.new_token_ids) < held.interval
                and only_new_tokens(output)
            ):
                held.token_ids += output.new_token_ids
                held_now += 1
                continue
            else:
                if held.token_ids:
                    output = msgspec.structs.replace(output, new_token_ids=held.token_ids + output.new_token_ids)
                    held.token_ids = []
                if output.finish_reason is not None:
                    del requests[request_id]
            kept.append(output)
        self.held += held_now
        return kept

    def _forget_gone(self) -> None:
        """Requests aborted or otherwise ended without a final output: nothing will ever flush them."""
        for request_id in [r for r in self._requests if self._request_of(r) is None]:
            del self._requests[request_id]
