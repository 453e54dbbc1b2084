"""The preprocess stage's chat and image handling, without Triton."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.interface import InvalidInput
from preprocess.chat import detect_content_format
from preprocess.default import Preprocessor
from preprocess.images import ImageLimits, decode_image, decode_images
from tests.support.chat_cases import STRING_TEMPLATE

USER_HI = [{"role": "user", "content": "hi"}]


def _text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


@pytest.fixture(scope="module")
def stage(tiny_model) -> Preprocessor:
    return Preprocessor({"tokenizer": str(tiny_model), "max_model_len": 512, "allow_request_chat_template": True})


def _build(stage: Preprocessor, messages, options: dict | None = None, parameters: dict | None = None, **inputs):
    arrays = {"messages": _text(json.dumps(messages)), **inputs}
    if options is not None:
        arrays["chat_options"] = _text(json.dumps(options))
    return stage.build_request(arrays, parameters or {})


def _png(width: int = 8, height: int = 8, color=(255, 0, 0), fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, format=fmt)
    return buffer.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# Sandbox -------------------------------------------------------------------------------------------------

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch SENTINEL') }}",
    "{{ joiner.__init__.__globals__['os'].popen('touch SENTINEL').read() }}",
    "{{ messages.__class__ }}",
    "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}{{ messages }}",
    "{{ messages[0].update({'role': 'system'}) }}",
    "{{ raise_exception('nope') }}",
    "{% for %}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_templates_that_reach_python_internals_get_invalid_input_not_execution(stage, tmp_path, template):
    sentinel = tmp_path / "pwned"
    template = template.replace("SENTINEL", str(sentinel))
    with pytest.raises(InvalidInput, match="chat template"):
        _build(stage, USER_HI, {"chat_template": template})
    assert not sentinel.exists()


def test_message_content_is_data_not_template_code(stage):
    request = _build(stage, [{"role": "user", "content": "{{ cycler.__init__.__globals__ }}"}])
    assert "{{ cycler.__init__.__globals__ }}" in request.postprocess_options["prompt_prefix"]


# Options -------------------------------------------------------------------------------------------------


def test_default_options_match_llm_chat(stage):
    request = _build(stage, USER_HI)
    assert request.postprocess_options["prompt_prefix"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert (
        request.prompt_token_ids
        == stage.tokenizer(request.postprocess_options["prompt_prefix"], add_special_tokens=False)["input_ids"]
    )


def test_chat_options_tensor_wins_over_request_parameters(stage):
    request = _build(stage, USER_HI, {"add_generation_prompt": False}, {"add_generation_prompt": "true"})
    assert request.postprocess_options["prompt_prefix"].endswith("<|im_end|>\n")
    request = _build(stage, USER_HI, None, {"add_generation_prompt": "false", "temperature": "0"})
    assert request.postprocess_options["prompt_prefix"].endswith("<|im_end|>\n")
    assert request.sampling == {"temperature": 0.0}


def test_chat_template_kwargs_reach_the_template(stage):
    options = {"chat_template": STRING_TEMPLATE, "chat_template_kwargs": '{"enable_thinking": false}'}
    assert _build(stage, USER_HI, options).postprocess_options["prompt_prefix"].endswith("<think></think>")
    options = {"chat_template": STRING_TEMPLATE}
    assert not _build(stage, USER_HI, options).postprocess_options["prompt_prefix"].endswith("<think></think>")


@pytest.mark.parametrize(
    ("options", "parameters", "message"),
    [
        ({"chat_template_kwarg": {}}, {}, "unknown key 'chat_template_kwarg'"),
        ({"chat_template_kwargs": {"tokenize": True}}, {}, "'tokenize' may not be set"),
        ({"chat_template_kwargs": [1]}, {}, "chat_template_kwargs: expected a JSON object"),
        ({"tools": "not a list"}, {}, "tools: expected a list of JSON objects"),
        ({"documents": [1, 2]}, {}, "documents: expected a list of JSON objects"),
        ({"add_generation_prompt": "maybe"}, {}, "add_generation_prompt: expected a boolean"),
        ({"continue_final_message": True, "add_generation_prompt": True}, {}, "cannot be combined"),
        ({"continue_final_message": True}, {}, "last message to be an assistant message"),
        ({"chat_template": ""}, {}, "non-empty template string"),
        (None, {"tools": "[1"}, "tools: invalid JSON"),
        (None, {"temprature": 0}, "did you mean 'temperature'"),
    ],
)
def test_bad_chat_options_name_the_problem(stage, options, parameters, message):
    with pytest.raises(InvalidInput, match=message):
        _build(stage, USER_HI, options, parameters)


def test_request_templates_need_the_deployment_to_allow_them(tiny_model):
    strict = Preprocessor({"tokenizer": str(tiny_model)})
    with pytest.raises(InvalidInput, match="does not accept per-request chat templates"):
        _build(strict, USER_HI, {"chat_template": STRING_TEMPLATE})


def test_deployment_template_inline_or_file(tiny_model, tmp_path):
    inline = Preprocessor({"tokenizer": str(tiny_model), "chat_template": "[{{ messages[0].content }}]"})
    assert _build(inline, USER_HI).postprocess_options["prompt_prefix"] == "[hi]"
    path = tmp_path / "template.jinja"
    path.write_text("<{{ messages[0].content }}>")
    from_file = Preprocessor({"tokenizer": str(tiny_model), "chat_template_file": str(path)})
    assert _build(from_file, USER_HI).postprocess_options["prompt_prefix"] == "<hi>"
    with pytest.raises(ValueError, match="not both"):
        Preprocessor({"tokenizer": str(tiny_model), "chat_template": "x", "chat_template_file": str(path)})


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("{", "messages: invalid JSON"),
        ({"role": "user"}, "non-empty JSON list"),
        ([1], r"messages\[0\]: expected an object"),
        ([{"role": "user"}], r"messages\[0\].content: required"),
        ([{"role": "user", "content": 3}], "expected a string or a list of parts"),
        ([{"role": "user", "content": [{"type": "audio_url"}]}], "'audio_url' is not supported"),
        ([{"role": "user", "content": [{"type": "text", "text": 1}]}], "text: expected a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url: expected"),
        ([{"role": "assistant", "content": None, "tool_calls": [{"type": "x"}]}], "tool_calls"),
    ],
)
def test_bad_messages_name_the_problem(stage, messages, message):
    text = messages if isinstance(messages, str) else json.dumps(messages)
    with pytest.raises(InvalidInput, match=message):
        stage.build_request({"messages": _text(text)}, {})


def test_exactly_one_of_text_input_and_messages(stage):
    with pytest.raises(InvalidInput, match="both given"):
        stage.build_request({"messages": _text(json.dumps(USER_HI)), "text_input": _text("hi")}, {})
    with pytest.raises(InvalidInput, match="neither given"):
        stage.build_request({}, {})
    with pytest.raises(InvalidInput, match="chat options apply to messages requests only"):
        stage.build_request({"text_input": _text("hi"), "chat_options": _text("{}")}, {})


def test_content_format_detection_follows_vllm(stage):
    assert detect_content_format(stage.tokenizer.chat_template) == "openai"
    assert detect_content_format(STRING_TEMPLATE) == "string"
    macro = "{% macro r(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
    assert detect_content_format(macro + "{% for m in messages %}{{ r(m.content) }}{% endfor %}") == "openai"


# Images --------------------------------------------------------------------------------------------------


def test_image_parts_become_placeholders_and_rgb_images(stage):
    red, blue = _png(color=(255, 0, 0)), _png(4, 2, (0, 0, 255), "JPEG")
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(red)}},
                {"type": "image_url", "image_url": {"url": _b64(blue)}},
            ],
        }
    ]
    request = _build(stage, messages, {"chat_template": STRING_TEMPLATE})
    # vLLM's string content format without interleaving: one placeholder per image, in front of the text.
    assert "user\n<image>\n<image>\nWhat is this?" in request.postprocess_options["prompt_prefix"]
    assert [(i.width, i.height) for i in request.images] == [(8, 8), (4, 2)]
    assert request.images[0].rgb[:3] == bytes([255, 0, 0])
    # The model's own (content-parts) template gets {"type": "image"} parts and renders what it renders.
    assert len(_build(stage, messages).images) == 2


def test_image_tensor_goes_with_text_input_only(stage):
    image = np.array([_b64(_png()).encode()], dtype=np.object_)
    request = stage.build_request({"text_input": _text("<image> hi"), "image": image}, {})
    assert len(request.images) == 1 and request.images[0].width == 8
    with pytest.raises(InvalidInput, match="send images as image_url parts"):
        _build(stage, USER_HI, image=image)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_formats_decode_to_rgb(fmt):
    image = decode_image(_b64(_png(5, 3, (10, 200, 30), fmt)), ImageLimits(), "image[0]")
    assert (image.width, image.height, len(image.rgb)) == (5, 3, 5 * 3 * 3)


def _bomb_png(width: int, height: int) -> bytes:
    """A valid PNG header claiming a huge image, followed by a tiny (wrong) data chunk: cheap to send."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("source", "limits", "message"),
    [
        ("not base64!", ImageLimits(), "invalid base64"),
        (_b64(b"hello, not an image"), ImageLimits(), "not an image in a supported format"),
        (_b64(_png(64, 64)[:60]), ImageLimits(), "cannot decode the image"),
        (_b64(_png(64, 64)), ImageLimits(max_image_bytes=50), "more than max_image_bytes=50"),
        (_b64(_png(64, 64)), ImageLimits(max_image_pixels=1000), "64x64 = 4096 pixels, more than max_image_pixels"),
        (_b64(_bomb_png(100_000, 100_000)), ImageLimits(), "more than max_image_pixels"),
        ("data:text/plain;base64," + _b64(b"x"), ImageLimits(), "is not an image"),
        ("data:image/png," + "abc", ImageLimits(), "expected a base64 data URL"),
        ("https://example.com/cat.png", ImageLimits(), "only base64 data or data: URLs"),
        ("", ImageLimits(), "empty image"),
        (_b64(_png(1, 1, fmt="TIFF")), ImageLimits(), "not an image in a supported format"),
    ],
)
def test_bad_images_name_the_problem(source, limits, message):
    with pytest.raises(InvalidInput, match=message):
        decode_image(source, limits, "image[0]")


def test_too_many_images():
    with pytest.raises(InvalidInput, match="3 images, more than max_images=2"):
        decode_images([_b64(_png())] * 3, ImageLimits(max_images=2), "image")


def test_image_limits_come_from_settings(tiny_model):
    stage = Preprocessor({"tokenizer": str(tiny_model), "max_images": 1, "max_image_pixels": 10})
    assert stage.image_limits == ImageLimits(max_image_pixels=10, max_images=1)
    with pytest.raises(ValueError, match="max_images"):
        Preprocessor({"tokenizer": str(tiny_model), "max_images": "many"})


def test_stage_declares_the_new_inputs():
    names = [spec.name for spec in Preprocessor.inputs]
    assert {"messages", "image", "chat_options"} <= set(names)
    assert Path(__file__).exists()


# Property: any JSON in messages / chat_options is a request or an InvalidInput, never another exception -------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
_part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", "image_url", "audio"])},
    optional={
        "text": st.text(max_size=8) | _json,
        "image_url": st.sampled_from([{"url": _b64(_png())}, {"url": "data:image/png;base64," + _b64(_png())}, "y"]),
    },
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "user", "assistant", "tool", "bad"])},
    optional={
        "content": st.text(max_size=10) | st.lists(_part | st.text(max_size=4), max_size=3) | _json,
        "tool_calls": st.just([{"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]) | _json,
        "name": st.text(max_size=4) | _json,
    },
)
_options = st.fixed_dictionaries(
    {},
    optional={
        "add_generation_prompt": st.booleans() | _json,
        "continue_final_message": st.booleans() | _json,
        "chat_template_kwargs": st.dictionaries(st.text(max_size=8), _json, max_size=3) | _json,
        "tools": st.lists(st.dictionaries(st.text(max_size=4), _json, max_size=2), max_size=2) | _json,
        "documents": st.lists(st.dictionaries(st.sampled_from(["title", "text"]), _json), max_size=2) | _json,
        "chat_template": st.sampled_from([STRING_TEMPLATE, "{{ messages[0].content }}", "{{ x.__y__ }}", "{% if"]),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_message, max_size=4) | _json, _options | _json)
def test_any_chat_json_is_a_request_or_invalid_input(stage, messages, options):
    inputs = {"messages": _text(json.dumps(messages)), "chat_options": _text(json.dumps(options))}
    try:
        request = stage.build_request(inputs, {})
    except InvalidInput as exc:
        assert str(exc)
        return
    assert all(isinstance(t, int) for t in request.prompt_token_ids)
