"""A vision-language model end to end: the tiny LLaVA (built offline) behind its own tritonserver, rendered from
the example deployments/examples/vision-language.yaml as it is, against vLLM's own offline output for the same
images and prompts."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

import repo_render
from tests.integration.test_chat import run_offline
from tests.support.triton_helpers import http_generate
from tools.build_tiny_llava import DEFAULT_OUT as TINY_LLAVA_DIR
from tools.build_tiny_llava import build as build_tiny_llava
from tools.triton_server import start_on_free_ports

pytestmark = pytest.mark.server

MAX_TOKENS = 16
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS}
PLAIN, STREAM = "vlm_model", "vlm_model_stream"


def _image(color: tuple[int, int, int], fmt: str, size: tuple[int, int] = (80, 64)) -> str:
    """An image with a colour and a stripe, encoded, base64. (Random noise would not do: after CLIP's
    normalisation all noise images look alike to the random tiny model.)"""
    image = Image.new("RGB", size, color)
    image.paste((255 - color[0], 255 - color[1], 255 - color[2]), (0, 0, size[0] // 4, size[1]))
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


IMAGES = {
    "png": _image((220, 30, 30), "PNG"),
    "jpeg": _image((30, 30, 220), "JPEG"),
    "webp": _image((30, 200, 30), "WEBP"),
}


def _chat(image_b64: str, mime: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/{mime};base64,{image_b64}"}},
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
    ]


CHAT_CASES = [{"messages": _chat(IMAGES[kind], kind), "options": {}} for kind in ("png", "jpeg", "webp")]
TEXT_PROMPT = "<image>\nDescribe the image."


def test_the_torchvision_free_hook_is_a_registered_vllm_plugin():
    """vLLM runs it in its EngineCore process; registered by the editable install (tools/setup_env.sh)."""
    from importlib.metadata import PackageNotFoundError, distribution, entry_points

    try:
        distribution("triton-vllm-serving")
    except PackageNotFoundError:
        pytest.skip("the project is not installed here (run from its checkout on PYTHONPATH): no entry points")
    values = {ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert "core.torchvision_free:install" in values, "re-run tools/setup_env.sh: the project's entry point is missing"


def test_the_hook_serves_the_pillow_twin_only_without_torchvision():
    import importlib

    from core import torchvision_free

    if torchvision_free.torchvision_available():  # a GPU machine: torchvision works, nothing is replaced
        assert torchvision_free.install() is False
        module = importlib.import_module(torchvision_free.TORCHVISION_MODULE)
        assert module.__name__ == torchvision_free.TORCHVISION_MODULE
    else:  # the CPU set-up (tools/setup_env.sh removes the CUDA-only torchvision)
        assert torchvision_free.install() is True
        module = importlib.import_module(torchvision_free.TORCHVISION_MODULE)
        assert module.__name__ == torchvision_free.PILLOW_TWIN
    assert module._num_image_tokens((56, 56), (14, 14)) == (4, 4)


@pytest.fixture(scope="module")
def vlm_repository(tmp_path_factory):
    build_tiny_llava(TINY_LLAVA_DIR)
    out = tmp_path_factory.mktemp("vlm") / "model_repository"
    deployment = repo_render.load_deployment(repo_render.ROOT / "deployments" / "examples" / "vision-language.yaml")
    repo_render.write(repo_render.render(deployment, out), out)
    return out


@pytest.fixture(scope="module")
def vlm_offline(vlm_repository, tmp_path_factory):
    """vLLM offline: LLM.chat for the chat cases, LLM.generate for text_input + image."""
    model_json = vlm_repository / "vllm_core" / "1" / "model.json"
    chat = run_offline(CHAT_CASES, tmp_path_factory.mktemp("vlm_chat"), model_json, MAX_TOKENS)
    prompts = [{"prompt": TEXT_PROMPT, "images": [IMAGES["png"]]}]
    generate = run_offline(prompts, tmp_path_factory.mktemp("vlm_generate"), model_json, MAX_TOKENS, chat=False)
    return {"chat": chat, "generate": generate}


@pytest.fixture(scope="module")
def vlm_server(vlm_repository, vlm_offline, tmp_path_factory):
    """A second tritonserver serving the VLM repository, once for this module (after the offline run, so the
    two engines do not compete for the 2 cores during start-up)."""
    log = tmp_path_factory.mktemp("vlm_triton") / "tritonserver.log"
    server = start_on_free_ports(vlm_repository, log, exit_timeout_secs=10)
    yield server
    server.stop()


def _infer(server, model: str = PLAIN, **arrays: np.ndarray) -> dict:
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, inputs)
    finally:
        client.close()
    return {name: result.as_numpy(name) for name in ("text_output", "num_input_tokens")}


def _strings(*values: str) -> np.ndarray:
    return np.array([v.encode("utf-8") for v in values], dtype=np.object_)


def _chat_request(server, index: int) -> dict:
    return _infer(
        server,
        messages=_strings(json.dumps(CHAT_CASES[index]["messages"])),
        sampling_parameters=_strings(json.dumps(GREEDY)),
        exclude_input_in_output=np.array([True]),
        return_num_input_tokens=np.array([True]),
    )


@pytest.mark.parametrize("index", range(len(CHAT_CASES)))
def test_image_chat_equals_llm_chat(vlm_server, vlm_offline, index):
    out = _chat_request(vlm_server, index)
    expected = vlm_offline["chat"][index]
    assert out["text_output"][0].decode("utf-8") == expected["text"]
    # the image placeholder expanded to the vision tower's 16 patch tokens in both
    assert int(out["num_input_tokens"][0]) == len(expected["prompt_token_ids"])


def test_different_images_give_different_outputs(vlm_server, vlm_offline):
    texts = {_chat_request(vlm_server, i)["text_output"][0] for i in range(len(CHAT_CASES))}
    assert len(texts) == len(CHAT_CASES)
    assert len({case["text"] for case in vlm_offline["chat"]}) == len(CHAT_CASES)


def test_image_tensor_with_text_input_equals_llm_generate(vlm_server, vlm_offline):
    """The Triton vLLM backend's form: text_input with the placeholder, base64 images in `image`."""
    out = _infer(
        vlm_server,
        text_input=_strings(TEXT_PROMPT),
        image=_strings(IMAGES["png"]),
        sampling_parameters=_strings(json.dumps(GREEDY)),
        exclude_input_in_output=np.array([True]),
    )
    assert out["text_output"][0].decode("utf-8") == vlm_offline["generate"][0]["text"]


def test_streaming_image_chat_equals_llm_chat(vlm_server, vlm_offline):
    import tritonclient.grpc as grpcclient

    from tests.support.triton_helpers import grpc_stream

    inputs = []
    for name, array in {
        "messages": _strings(json.dumps(CHAT_CASES[0]["messages"])),
        "sampling_parameters": _strings(json.dumps(GREEDY)),
        "stream": np.array([True]),
    }.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    responses = grpc_stream(vlm_server.grpc_url, inputs, model=STREAM)
    text = "".join(o["text_output"][0].decode("utf-8") for o, _ in responses if "text_output" in o)
    assert text == vlm_offline["chat"][0]["text"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}}], "invalid base64"),
        (
            [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGES["png"][:80]}}],
            "cannot decode the image",
        ),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}], "not an image"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGES["png"]}}] * 3, "max_images=2"),
    ],
)
def test_bad_images_get_invalid_arg(vlm_server, content, message):
    reply = http_generate(
        vlm_server.http_url, {"messages": json.dumps([{"role": "user", "content": content}])}, model=PLAIN
    )
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]


def test_tiny_llava_in_vllm_equals_transformers(vlm_offline):
    """The checkpoint's rewritten weight names load into the same model on both sides."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(TINY_LLAVA_DIR)
    model = LlavaForConditionalGeneration.from_pretrained(TINY_LLAVA_DIR, dtype=torch.float32)
    image = Image.open(io.BytesIO(base64.b64decode(IMAGES["png"]))).convert("RGB")
    inputs = processor(images=image, text=TEXT_PROMPT, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    assert out[0, inputs["input_ids"].shape[1] :].tolist() == vlm_offline["generate"][0]["token_ids"]
