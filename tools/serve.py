"""Serve a model repository with the real tritonserver on 127.0.0.1, show a first answer, serve until Ctrl-C.

python tools/serve.py [--repository model_repository] [--http-port 8000] [--grpc-port 8001]
                      [--metrics-port 8002] [--address 127.0.0.1] [--log-file PATH]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.triton_server import TritonServer  # noqa: E402

FIRST_REQUEST = {
    "text_input": "What is Triton Inference Server?",
    "parameters": {"stream": False, "temperature": 0, "max_tokens": 32},
}


def first_answer(http_url: str, model: str) -> str:
    url = f"http://{http_url}/v2/models/{model}/generate"
    body = json.dumps(FIRST_REQUEST).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--model", default="vllm_model", help="the model the first request goes to")
    parser.add_argument("--log-file", type=Path, default=ROOT / ".serve" / "tritonserver.log")
    args = parser.parse_args(argv)

    args.log_file.parent.mkdir(parents=True, exist_ok=True)
    server = TritonServer(
        args.repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        address=args.address,
        log_file=args.log_file,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    print(f"Starting tritonserver on {args.repository} (log: {args.log_file}) ...", flush=True)
    try:
        seconds = server.start_and_wait(timeout=600)
        print(
            f"Ready in {seconds:.1f} s: HTTP {server.http_url}, gRPC {server.grpc_url}, "
            f"metrics {args.address}:{args.metrics_port}\n"
        )
        print(
            f"$ curl -X POST {server.http_url}/v2/models/{args.model}/generate \\\n    -d '{json.dumps(FIRST_REQUEST)}'"
        )
        print(first_answer(server.http_url, args.model), "\n", flush=True)
        print("Serving until Ctrl-C.", flush=True)
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(1.0)
        if server.process.poll() is not None:
            print(f"tritonserver exited with code {server.process.returncode}; see {args.log_file}", file=sys.stderr)
            return 1
    except (RuntimeError, TimeoutError) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 1
    finally:
        print("Stopping tritonserver ...", flush=True)
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
