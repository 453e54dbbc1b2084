"""The corpus of hostile requests: each case says what to send and what error must come back.

A case is data, so adding one is one entry: `Case(name, payload, status, message)` posts `payload` to
`/v2/models/<model>/generate` (HTTP status and a substring of the error that names the problem); `raw=True`
sends `payload` as the raw body bytes; `endpoint="infer"` posts to `/infer` (Triton's own tensor checks).
`grpc_bytes` cases send a raw BYTES `text_input` over gRPC and expect INVALID_ARG.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tests.support.triton_helpers import PLAIN_MODEL, STREAM_MODEL

CONTEXT = 512  # max_model_len of the default deployment

# Measured on Triton 2.51: its HTTP /generate frontend answers JSON it cannot map to the input tensors with
# status 500 before any model runs (the models cannot change that), with messages such as "failed to parse
# the request JSON", "Converting keyword: 'parameters': Unable to parse JSON bytes array", "attempt to access
# JSON non-string as string". Documented here; the fuzz test accepts a 500 only with one of these fragments.
FRONTEND_PARSE_ERRORS = ("JSON", "Unable to parse")


@dataclass(frozen=True)
class Case:
    name: str
    payload: Any
    status: int = 400
    message: str = ""  # a substring of the error message (lower-cased match)
    model: str = PLAIN_MODEL
    endpoint: str = "generate"
    raw: bool = False
    extra: dict = field(default_factory=dict)


def _sp(**sampling: Any) -> dict[str, Any]:
    return {"text_input": "hello", "sampling_parameters": json.dumps(sampling)}


def _png(width: int, height: int, complete: bool = True) -> str:
    """A base64 PNG; `complete=False` keeps only the signature and the IHDR chunk (a header that claims any size)."""
    import base64
    import io
    import struct
    import zlib

    if not complete:

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        idat = zlib.compress(b"\x00" * 1024)  # the first few rows only: the rest is never sent
        return base64.b64encode(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)).decode()
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _chat(messages: Any, **parameters: Any) -> dict[str, Any]:
    return {"messages": messages if isinstance(messages, str) else json.dumps(messages), "parameters": parameters}


CASES: list[Case] = [
    # the body itself
    Case("malformed JSON body", b'{"text_input": "hello", ', raw=True, status=500, message="parse"),
    Case("body is a JSON list", b'["hello"]', raw=True, status=500, message="non-object"),
    Case("non-UTF-8 body", b'{"text_input": "\xff\xfe"}', raw=True),
    # the prompt
    Case("no prompt", {"parameters": {"max_tokens": 4}}, message="send exactly one of text_input and messages"),
    Case("prompt is a number", {"text_input": 5}, status=500, message="non-string"),
    Case("prompt is a list of two", {"text_input": ["a", "b"]}),
    Case("10 MB prompt", {"text_input": "word " * (2 * 1024 * 1024)}, message="context"),
    Case("prompt longer than the context", {"text_input": "word " * 2000}, message="context"),
    # the sampling_parameters tensor
    Case("sampling_parameters not JSON", {"text_input": "hello", "sampling_parameters": "{"}, message="sampling"),
    Case(
        "sampling_parameters a JSON list", {"text_input": "hello", "sampling_parameters": "[1, 2]"}, message="sampling"
    ),
    Case(
        "temperature NaN", {"text_input": "hello", "sampling_parameters": '{"temperature": NaN}'}, message="temperature"
    ),
    Case("top_p Infinity", {"text_input": "hello", "sampling_parameters": '{"top_p": Infinity}'}, message="top_p"),
    Case("temperature negative", _sp(temperature=-1), message="temperature"),
    Case("temperature huge", _sp(temperature=1e308), message="temperature"),
    Case("top_p above 1", _sp(top_p=2), message="top_p"),
    Case("top_p zero", _sp(top_p=0), message="top_p"),
    Case("top_k negative", _sp(top_k=-5), message="top_k"),
    Case("min_p above 1", _sp(min_p=1.5), message="min_p"),
    Case("max_tokens zero", _sp(max_tokens=0), message="max_tokens"),
    Case("max_tokens negative", _sp(max_tokens=-1), message="max_tokens"),
    Case("max_tokens 2**63", _sp(max_tokens=2**63), message="max_tokens"),
    Case("max_tokens a string", _sp(max_tokens="many"), message="max_tokens"),
    Case("max_tokens a boolean", _sp(max_tokens=True), message="max_tokens"),
    Case("n zero", _sp(n=0), message="n"),
    Case("presence_penalty out of range", _sp(presence_penalty=5), message="presence_penalty"),
    Case("frequency_penalty out of range", _sp(frequency_penalty=-5), message="frequency_penalty"),
    Case("repetition_penalty zero", _sp(repetition_penalty=0), message="repetition_penalty"),
    Case("seed a string", _sp(seed="abc"), message="seed"),
    Case("stop a number", _sp(stop=5), message="stop"),
    Case("logprobs huge", _sp(logprobs=1000), message="logprobs"),
    Case("unknown sampling key", _sp(temprature=0.5), message="temperature"),
    Case("unknown lora", _sp(lora_name="nope"), message="lora_name"),
    Case(
        "temperature as a request parameter string",
        {"text_input": "hi", "parameters": {"temperature": "hot"}},
        message="temperature",
    ),
    # chat messages and templates
    Case("messages not JSON", _chat("[{'role': 'user'"), message="messages"),
    Case("messages not a list", _chat({"role": "user", "content": "hi"}), message="messages"),
    Case("unknown role", _chat([{"role": "wizard", "content": "hi"}]), message="role"),
    Case("content of a wrong type", _chat([{"role": "user", "content": 5}]), message="content"),
    Case(
        "both text_input and messages",
        {**_chat([{"role": "user", "content": "hi"}]), "text_input": "hi"},
        message="exactly one of",
    ),
    Case(
        "template injection through a per-request template",
        _chat([{"role": "user", "content": "hi"}], chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}"),
        message="chat_template",
    ),
    Case(
        "chat options on a text prompt",
        {"text_input": "hi", "parameters": {"add_generation_prompt": True}},
        message="chat",
    ),
    # images
    Case("invalid base64 image", {"text_input": "hi", "image": ["!!!not base64!!!"]}, message="base64"),
    Case("truncated image", {"text_input": "hi", "image": [_png(8, 8)[:60]]}, message="image"),
    Case("bytes that are no image", {"text_input": "hi", "image": ["aGVsbG8gd29ybGQ="]}, message="image"),
    Case(
        "decompression bomb (100000 x 100000 header)",
        {"text_input": "hi", "image": [_png(100_000, 100_000, False)]},
        message="pixels",
    ),
    Case("50-megapixel image", {"text_input": "hi", "image": [_png(7072, 7072, False)]}, message="pixels"),
    Case("too many images", {"text_input": "hi", "image": [_png(4, 4)] * 5}, message="images"),
    Case(
        "image part with an http URL",
        _chat(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://example.invalid/x.png"}}]}]
        ),
        message="image",
    ),
    # flags
    Case(
        "stream with the prompt echoed",
        {"text_input": "hi", "stream": True, "exclude_input_in_output": False},
        model=STREAM_MODEL,
        message="exclude_input_in_output",
    ),
    Case("stream flag a string", {"text_input": "hi", "stream": "maybe"}, status=500, message="non-boolean"),
    # Triton's own tensor checks on /infer
    Case(
        "wrong dtype",
        {"inputs": [{"name": "text_input", "shape": [1], "datatype": "INT32", "data": [1]}]},
        endpoint="infer",
        message="data-type",
    ),
    Case(
        "wrong shape",
        {"inputs": [{"name": "text_input", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]},
        endpoint="infer",
        message="shape",
    ),
    Case(
        "shape does not match the data",
        {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["a", "b"]}]},
        endpoint="infer",
    ),
]

GRPC_BYTES_CASES: dict[str, bytes] = {
    "invalid UTF-8 prompt": b"\xff\xfe\xfd",
    "truncated UTF-8 sequence": "Grüße".encode()[:3],
}
