"""Render a deployment, serve it, and ask it once through every way in; print what answered and how long loading
took (and the GPU memory in use, where there is a GPU).

    python tools/check_deployment.py DEPLOYMENT [--set NAME=VALUE] [--out DIR] [--report FILE] [--max-tokens 16]

The ways in: HTTP /generate, HTTP /infer and gRPC ModelInfer on the plain model; /generate_stream (SSE) and a
gRPC stream on the streaming model; a chat request (`messages` as a JSON string) on each. Exit 0 when every one
answered with tokens (a random-weight model's tokens may decode to no text). Used on the GPU machine for the
8B-shape and tensor-parallel deployments (README "GPU").
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from repo_render import ConfigError, load_deployment, render, write  # noqa: E402
from repo_render.substitute import set_argument  # noqa: E402
from tools.triton_server import start_on_free_ports  # noqa: E402

PROMPT = "What is Triton Inference Server?"
CHAT = [{"role": "user", "content": "Say hello."}]


def gpu_memory_mib() -> list[int] | None:
    """Memory in use per GPU (nvidia-smi), None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(line) for line in out.stdout.split()] if out.returncode == 0 else None


def _post_json(url: str, payload: dict[str, Any]) -> bytes:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as reply:
        return reply.read()


def _summary(text: str, finish_reason: Any = None, tokens: Any = None, responses: int = 1) -> dict[str, Any]:
    return {"chars": len(text), "finish_reason": finish_reason, "output_tokens": tokens, "responses": responses}


def _one(array: Any) -> Any:
    if array is None:
        return None
    value = np.asarray(array).reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value.item()


class Client:
    def __init__(self, http_url: str, grpc_url: str, plain: str, streaming: str, max_tokens: int) -> None:
        self.http_url, self.grpc_url = http_url, grpc_url
        self.plain, self.streaming = plain, streaming
        self.sampling = {"temperature": 0, "max_tokens": max_tokens}
        # The vLLM backend's optional outputs are sent only when asked for.
        self.flags = {"return_finish_reason": True, "return_num_output_tokens": True}

    def generate(self, **fields: Any) -> dict[str, Any]:
        body = json.loads(_post_json(f"http://{self.http_url}/v2/models/{self.plain}/generate", self._body(fields)))
        return _summary(body["text_output"], body.get("finish_reason"), body.get("num_output_tokens"))

    def generate_stream(self, **fields: Any) -> dict[str, Any]:
        url = f"http://{self.http_url}/v2/models/{self.streaming}/generate_stream"
        payload = self._body({**fields, "stream": True})
        events = [
            json.loads(line[len("data: ") :])
            for line in _post_json(url, payload).decode().splitlines()
            if line.startswith("data: ")
        ]
        if any("error" in event for event in events):
            raise RuntimeError(next(event["error"] for event in events if "error" in event))
        text = "".join(event.get("text_output", "") for event in events)
        tokens = sum(event.get("num_output_tokens", 0) for event in events)  # each response counts its own delta
        last = events[-1] if events else {}
        return _summary(text, last.get("finish_reason"), tokens, len(events))

    def http_infer(self) -> dict[str, Any]:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.http_url, network_timeout=300)
        try:
            result = client.infer(self.plain, self._inputs(httpclient, PROMPT))
        finally:
            client.close()
        return self._outputs(result)

    def grpc_infer(self) -> dict[str, Any]:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            result = client.infer(self.plain, self._inputs(grpcclient, PROMPT), client_timeout=300)
        finally:
            client.close()
        return self._outputs(result)

    def grpc_stream(self, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
        import tritonclient.grpc as grpcclient

        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.grpc_url)
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = self._inputs(grpcclient, PROMPT if messages is None else None, messages=messages, stream=True)
        text, responses, tokens, last = "", 0, 0, None
        try:
            client.async_stream_infer(self.streaming, inputs, enable_empty_final_response=True)
            while True:
                result, error = results.get(timeout=300)
                if error is not None:
                    raise error
                responses += 1
                if result.as_numpy("text_output") is not None:
                    text += _one(result.as_numpy("text_output"))
                    tokens += _one(result.as_numpy("num_output_tokens")) or 0  # this response's delta
                    last = result
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
        finally:
            client.stop_stream()
            client.close()
        finish = _one(last.as_numpy("finish_reason")) if last is not None else None
        return _summary(text, finish, tokens, responses)

    def _body(self, fields: dict[str, Any]) -> dict[str, Any]:
        if "messages" in fields:
            fields = {**fields, "messages": json.dumps(fields["messages"])}  # a JSON string, not a list
        else:
            fields = {"text_input": PROMPT, **fields}
        return {**fields, **self.flags, "parameters": self.sampling}

    def _inputs(self, module: Any, text: str | None, messages: Any = None, stream: bool = False) -> list[Any]:
        arrays = [("sampling_parameters", np.array([json.dumps(self.sampling).encode()], dtype=np.object_), "BYTES")]
        if text is not None:
            arrays.append(("text_input", np.array([text.encode()], dtype=np.object_), "BYTES"))
        if messages is not None:
            arrays.append(("messages", np.array([json.dumps(messages).encode()], dtype=np.object_), "BYTES"))
        for name, value in {"stream": stream, **self.flags}.items():
            arrays.append((name, np.array([value], dtype=np.bool_), "BOOL"))
        tensors = []
        for name, array, dtype in arrays:
            tensor = module.InferInput(name, list(array.shape), dtype)
            if module.__name__.endswith("http"):
                tensor.set_data_from_numpy(array, binary_data=False)
            else:
                tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        return tensors

    def _outputs(self, result: Any) -> dict[str, Any]:
        return _summary(
            _one(result.as_numpy("text_output")),
            _one(result.as_numpy("finish_reason")),
            _one(result.as_numpy("num_output_tokens")),
        )


def ways_in(client: Client) -> dict[str, Callable[[], dict[str, Any]]]:
    return {
        "http /generate": client.generate,
        "http /infer": client.http_infer,
        "grpc ModelInfer": client.grpc_infer,
        "http /generate_stream (SSE)": client.generate_stream,
        "grpc stream": client.grpc_stream,
        "chat: http /generate": lambda: client.generate(messages=CHAT),
        "chat: grpc stream": lambda: client.grpc_stream(messages=CHAT),
    }


def check(repository: Path, plain: str, streaming: str, max_tokens: int, log_file: Path) -> dict[str, Any]:
    before = gpu_memory_mib()
    started = time.monotonic()
    server = start_on_free_ports(repository, log_file, timeout=1200)
    report: dict[str, Any] = {"load_seconds": round(time.monotonic() - started, 1), "log": str(log_file)}
    try:
        report["gpu_memory_mib"] = {"before": before, "loaded": gpu_memory_mib()}
        client = Client(server.http_url, server.grpc_url, plain, streaming, max_tokens)
        answers: dict[str, Any] = {}
        for name, ask in ways_in(client).items():
            began = time.monotonic()
            try:
                answers[name] = {**ask(), "seconds": round(time.monotonic() - began, 3)}
            except Exception as exc:  # noqa: BLE001 - reported per way in; the others still run
                answers[name] = {"error": f"{type(exc).__name__}: {exc}"}
        report["answers"] = answers
        report["ok"] = all("error" not in a and (a["output_tokens"] or 0) > 0 for a in answers.values())
    finally:
        server.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("deployment", type=Path)
    parser.add_argument(
        "--set", action="append", default=[], type=set_argument, metavar="NAME=VALUE", help="${NAME} in the file"
    )
    parser.add_argument("--out", type=Path, help="where to render (default: a temporary folder)")
    parser.add_argument("--report", type=Path, help="also write the report here (JSON)")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    try:
        deployment = load_deployment(args.deployment, dict(args.set))
    except ConfigError as exc:
        print(f"check_deployment: {args.deployment}: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="check-deployment-") as scratch:
        out = args.out or Path(scratch) / "repository"
        write(render(deployment, out), out)
        log_file = (args.report.parent if args.report else Path(scratch)) / "tritonserver.log"
        report = check(out, deployment.names.plain, deployment.names.streaming, args.max_tokens, log_file)
    report["deployment"] = str(args.deployment)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.report:
        args.report.write_text(text + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
