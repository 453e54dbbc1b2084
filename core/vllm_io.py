"""Between the project's protocol and vLLM's types: SamplingParams from an EngineRequest (with vLLM's own
validation as INVALID_ARG), RequestOutputs to EngineResponses (token windows, logprobs, every sequence of n),
images, and which of vLLM's exceptions are the client's. Triton-free."""

from __future__ import annotations

import functools
from typing import Any

from core.interface import InvalidInput
from core.protocol import EngineRequest, EngineResponse, Position, RgbImage, SequenceDelta, TokenLogprob
from core.token_windows import TokenWindows


def token_logprobs(logprobs: Any) -> list[Position | None] | None:
    """vLLM's logprobs (per position, token id -> Logprob) as the protocol's, keyed by the id as a string."""
    if logprobs is None:
        return None
    return [
        None
        if position is None
        else {str(token_id): TokenLogprob(lp.logprob, lp.rank, lp.decoded_token) for token_id, lp in position.items()}
        for position in logprobs
    ]


def sequence_delta(seq: Any, windows: TokenWindows | None) -> SequenceDelta:
    token_ids = list(seq.token_ids)
    delta = SequenceDelta(
        index=seq.index,
        text=seq.text,
        token_ids=token_ids,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
        cumulative_logprob=seq.cumulative_logprob,
        logprobs=token_logprobs(seq.logprobs),
    )
    if windows is not None:
        delta.context_ids, delta.context_prompt_tokens = windows.next_window(seq.index, token_ids)
    return delta


def every_sequence(response: EngineResponse, n: int, last: dict[int, SequenceDelta], logprobs: bool) -> None:
    """One element per sequence in every streamed response, as the vLLM backend sends (vLLM's DELTA outputs carry
    only the sequences that moved): a quiet sequence gets no text, no tokens and its last finish reason."""
    for seq in response.outputs:
        last[seq.index] = seq
    if len(response.outputs) == n:
        return
    present = {seq.index for seq in response.outputs}
    for index in range(n):
        if index not in present:
            before = last.get(index)
            quiet = SequenceDelta(index, "", [], logprobs=[] if logprobs else None)
            quiet.context_ids = [] if response.decode is not None else None
            if before is not None:
                quiet.finish_reason, quiet.stop_reason = before.finish_reason, before.stop_reason
                quiet.cumulative_logprob = before.cumulative_logprob
            response.outputs.append(quiet)
    response.outputs.sort(key=lambda seq: seq.index)


def to_engine_response(
    output: Any,
    postprocess_options: dict[str, Any],
    windows: TokenWindows | None = None,
    decode: dict[str, bool] | None = None,
    streamed: bool = False,
) -> EngineResponse:
    """vLLM RequestOutput (DELTA or FINAL_ONLY kind) -> EngineResponse; with `windows`, for postprocess to decode."""
    return EngineResponse(
        outputs=[sequence_delta(seq, windows) for seq in output.outputs],
        num_input_tokens=len(output.prompt_token_ids or ()),
        finished=output.finished,
        postprocess_options=postprocess_options,
        request_id=str(output.request_id),
        streamed=streamed,
        decode=decode if windows is not None else None,
        prompt_logprobs=token_logprobs(output.prompt_logprobs) or None,
    )


def rgb_image(image: RgbImage) -> Any:
    """EngineRequest.images entry -> PIL RGB image: a copy of pixels that preprocess decoded and checked."""
    from PIL import Image

    return Image.frombytes("RGB", (image.width, image.height), image.rgb)


@functools.cache
def client_errors() -> tuple[type[BaseException], ...]:
    """The exceptions vLLM raises for a request the client must fix. vLLM 0.26's VLLMValidationError is a
    ValueError; from 0.32 it is a VLLMClientError, which is not."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:
        return (TypeError, ValueError)
    return (TypeError, ValueError, VLLMClientError)


@functools.cache
def sampling_param_fields() -> frozenset[str]:
    """The installed vLLM's SamplingParams fields (a msgspec Struct)."""
    import msgspec
    from vllm.sampling_params import SamplingParams

    return frozenset(f.name for f in msgspec.structs.fields(SamplingParams))


def sampling_params(request: EngineRequest, offload_detokenization: bool) -> Any:
    """vLLM SamplingParams for a request; vLLM's own validation errors become InvalidInput."""
    from vllm.sampling_params import (
        RepetitionDetectionParams,
        RequestOutputKind,
        SamplingParams,
        StructuredOutputsParams,
    )

    params = dict(request.sampling)
    params.pop("lora_name", None)
    # preprocess knows the newest supported vLLM's fields; an older installed vLLM may lack some.
    missing = sorted(set(params) - sampling_param_fields())
    if missing:
        import vllm

        raise InvalidInput(
            f"sampling parameter {missing[0]!r} is not supported by the installed vLLM {vllm.__version__} "
            "(a newer vLLM has it)"
        )
    structured = params.pop("structured_outputs", None)
    if structured is not None:
        params["structured_outputs"] = StructuredOutputsParams(**structured)
    if (repetition := params.pop("repetition_detection", None)) is not None:
        params["repetition_detection"] = RepetitionDetectionParams(**repetition)
    kind = RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY
    if offload_detokenization and not params.get("stop"):
        params["detokenize"] = False  # postprocess decodes (see __init__)
    # Built afresh for each request and not kept: vLLM's input processing may copy it shallowly (as vLLM's own
    # OpenAI server asks) instead of deep-copying it, which took ~1 % of a plain stub's busy time in a wave
    params["skip_clone"] = True
    try:
        return SamplingParams(**params, output_kind=kind)
    except client_errors() as exc:
        raise InvalidInput(f"sampling_parameters: {exc}") from exc
