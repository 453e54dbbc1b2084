"""The documents that travel between the stages, as msgspec Structs decoded with validation: `engine_request`
(preprocess -> core) and `engine_response` (core -> postprocess, one per delta when streaming), each one element of
a STRING tensor (Triton's BYTES: any bytes). Each hop encodes once and decodes once, straight into these types;
a document of the wrong shape fails at decode with a message that names the field, e.g.
"Expected `int`, got `str` - at `$.prompt_token_ids[0]`".

`engine_request` is JSON: it carries the client's sampling parameters as they came (integers of any size) and
stays readable. `engine_response` is MessagePack: it carries vLLM's logprobs, and JSON has no -inf or NaN
(msgspec writes them as null; vLLM gives -inf to tokens that top-k/top-p masked when logprobs_mode is
processed_logprobs), so only MessagePack brings every float back as the engine gave it; it is also the faster
and smaller of the two (`tools/measure_detokenization.py --wire`, docs/performance.md).

`postprocess_options` is opaque to the core: it is copied into every response, because in the streaming
ensemble the postprocess step may only consume tensors that come from the core (docs/platform-notes.md T2).
"""

from __future__ import annotations

from typing import Any

import msgspec


class TokenLogprob(msgspec.Struct, array_like=True, gc=False):
    """One token's logprob at one position, as vLLM's Logprob.

    On the wire a 3-element array, [logprob, rank, decoded_token]: half the bytes of an object with keys for a
    256-token answer with logprobs 5. gc=False: it holds scalars only, so it is never part of a reference cycle,
    and the collector need not track the thousands of them in a long answer. Together 16-21 % less CPU to encode
    and decode answers with logprobs than a plain Struct (measured on the 2-core machine)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None  # None until decoded (postprocess/detokenize.py, when the engine did not)


# The logprobs of one token position: token id (a string: the key the public JSON gives it) -> its logprob.
Position = dict[str, TokenLogprob]


class RgbImage(msgspec.Struct, forbid_unknown_fields=True):
    """A decoded, size-checked image for vLLM's multi_modal_data: preprocess decodes, the engine process only
    wraps the pixels. `rgb`: width * height * 3 bytes, row-major (base64 in the JSON)."""

    width: int
    height: int
    rgb: bytes


class EngineRequest(msgspec.Struct, forbid_unknown_fields=True):
    sampling: dict[str, Any]
    prompt_token_ids: list[int] | None = None
    prompt: str | None = None  # used by the core only when prompt_token_ids is None (raw-text preprocess)
    stream: bool = False
    lora_name: str | None = None
    images: list[RgbImage] | None = None
    postprocess_options: dict[str, Any] = {}


class SequenceDelta(msgspec.Struct, forbid_unknown_fields=True):
    """New output of one sequence (index < n) since the previous response of the same request."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" once the sequence is finished
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None
    # One Position per new token; None when logprobs were not asked.
    logprobs: list[Position] | None = None
    # When the engine did not detokenize (EngineResponse.decode is set): the ids before `token_ids` that
    # postprocess/detokenize.py needs to decode them, the first `context_prompt_tokens` of them from the prompt.
    context_ids: list[int] | None = None
    context_prompt_tokens: int = 0


class EngineResponse(msgspec.Struct, forbid_unknown_fields=True):
    outputs: list[SequenceDelta]
    num_input_tokens: int
    finished: bool
    postprocess_options: dict[str, Any] = {}
    # The engine's request id (every delta of one request carries the same) and whether this response is one
    # streamed delta (False for a whole answer, also after merge_responses): the OpenAI-style postprocess needs
    # both to tell a `chat.completion.chunk` of a stream from a `chat.completion`.
    request_id: str = ""
    streamed: bool = False
    # Set when `text` and logprobs' decoded tokens are still to be made from the ids (postprocess/detokenize.py):
    # those of vLLM's skip_special_tokens, spaces_between_special_tokens, include_stop_str_in_output that differ
    # from vLLM's defaults (usually {}). None: the engine detokenized.
    decode: dict[str, bool] | None = None
    # Per prompt position (the first is null), as `logprobs`; in the first response only, when asked.
    prompt_logprobs: list[Position | None] | None = None
    # The error that ended the request, for a BLS caller of the core (an entry model, generate), as its message
    # with the code tagged ("[UNAVAILABLE] ..."): then the response's last, with no outputs. On Triton 2.51 a BLS
    # caller's response iterator never gets an error response that follows data responses, nor the FINAL flag it
    # carries, so the caller would wait forever; the core sends a BLS caller's errors in-band instead.
    error: str | None = None


class ResponseHeader(msgspec.Struct):
    """The fields of an engine_response that a BLS model routes by; decoding only these skips the rest unbuilt
    (about a tenth of a full decode for a long answer with logprobs)."""

    finished: bool
    streamed: bool = False
    error: str | None = None


def error_response(message: str) -> EngineResponse:
    """The in-band error that ends a BLS caller's request (EngineResponse.error)."""
    return EngineResponse(outputs=[], num_input_tokens=0, finished=True, error=message)


# Built once (a decoder compiles its type when constructed) and shared by every thread: they keep no state between
# calls (the core encodes on its sender threads, generate and the entry models decode on their workers).
_request_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(EngineRequest)
_response_encoder = msgspec.msgpack.Encoder()
_response_decoder = msgspec.msgpack.Decoder(EngineResponse)
_header_decoder = msgspec.msgpack.Decoder(ResponseHeader)

# What the decoders raise for a malformed document (msgspec.ValidationError, a wrong type, is one).
DecodeError = msgspec.DecodeError


def encode_request(request: EngineRequest) -> bytes:
    return _request_encoder.encode(request)


def decode_request(data: bytes | str) -> EngineRequest:
    return _request_decoder.decode(data)


def encode_response(response: EngineResponse) -> bytes:
    return _response_encoder.encode(response)


def decode_response(data: bytes) -> EngineResponse:
    return _response_decoder.decode(data)


def peek_response(data: bytes) -> ResponseHeader:
    return _header_decoder.decode(data)


def whole_answer(responses: list[bytes]) -> bytes:
    """The plain path's one engine_response from the core's encoded responses for a request.

    A non-streaming request gets one whole answer from the core: it passes as it is, neither decoded nor
    encoded again. Streamed deltas (a `stream: true` request to the plain model) are merged into one."""
    if not responses:
        raise ValueError("no responses to merge")
    if len(responses) == 1 and not peek_response(responses[0]).streamed:
        return responses[0]
    return encode_response(merge_responses([decode_response(raw) for raw in responses]))


def merge_responses(responses: list[EngineResponse], streamed: bool = False) -> EngineResponse:
    """Fold a request's consecutive deltas into one response, as if the engine had answered once after the last.

    `streamed=False` gives a whole answer (the plain path); True gives one larger streamed delta (the core
    coalescing a stream's queued deltas)."""
    if not responses:
        raise ValueError("no responses to merge")
    merged: dict[int, SequenceDelta] = {}
    for response in responses:
        for delta in response.outputs:
            seq = merged.get(delta.index)
            if seq is None:
                merged[delta.index] = SequenceDelta(
                    index=delta.index,
                    text=delta.text,
                    token_ids=list(delta.token_ids),
                    finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason,
                    cumulative_logprob=delta.cumulative_logprob,
                    logprobs=list(delta.logprobs) if delta.logprobs is not None else None,
                    context_ids=delta.context_ids,
                    context_prompt_tokens=delta.context_prompt_tokens,
                )
                continue
            if not seq.token_ids:  # a quiet first delta (n > 1): the first one with tokens has the window to use
                seq.context_ids, seq.context_prompt_tokens = delta.context_ids, delta.context_prompt_tokens
            seq.text += delta.text
            seq.token_ids.extend(delta.token_ids)
            seq.finish_reason = delta.finish_reason
            seq.stop_reason = delta.stop_reason
            seq.cumulative_logprob = delta.cumulative_logprob
            if delta.logprobs is not None:
                seq.logprobs = (seq.logprobs or []) + delta.logprobs
    last = responses[-1]
    return EngineResponse(
        outputs=[merged[i] for i in sorted(merged)],
        num_input_tokens=last.num_input_tokens,
        finished=last.finished,
        postprocess_options=last.postprocess_options,
        request_id=last.request_id,
        streamed=streamed,
        decode=last.decode,
        prompt_logprobs=next((r.prompt_logprobs for r in responses if r.prompt_logprobs is not None), None),
    )
