"""Serve a model repository with the real tritonserver on 127.0.0.1, show a first answer, serve until Ctrl-C.

python tools/serve.py [--repository model_repository] [--http-port 8000] [--grpc-port 8001]
                      [--metrics-port 8002] [--address 127.0.0.1] [--model NAME]
                      [--log-file PATH | --log-dir .serve/logs --keep-logs 10]

The first request goes to the repository's plain public model (read from the server once it is ready) unless
--model names one. Each run logs to its own file under --log-dir (the last --keep-logs are kept) unless
--log-file names one. When models fail to load, their names and errors are printed from the log.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
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
DEFAULT_LOG_DIR = ROOT / ".serve" / "logs"
LOG_PREFIX = "tritonserver-"


def first_answer(http_url: str, model: str) -> str:
    url = f"http://{http_url}/v2/models/{model}/generate"
    body = json.dumps(FIRST_REQUEST).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.read().decode()
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode()}"


def new_log_file(log_dir: Path, keep: int) -> Path:
    """A fresh log file for this run (named by its start time, sorting in time order), after deleting the
    oldest ones so that `keep` remain with it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = log_dir / f"{LOG_PREFIX}{stamp}-{os.getpid()}.log"
    older = sorted(p for p in log_dir.glob(f"{LOG_PREFIX}*.log") if p != path)
    for stale in older[: max(0, len(older) - (keep - 1))]:
        stale.unlink(missing_ok=True)
    path.touch()
    return path


def choose_model(public: dict[str, bool]) -> tuple[str | None, str]:
    """The model for the first request, from the server's public models (name -> streaming), and why."""
    plain = [name for name, streaming in public.items() if not streaming]
    if not plain:
        listed = ", ".join(public) or "none"
        return None, f"no plain (non-streaming) public model in the repository (public: {listed}); pass --model"
    notes = ["the repository's plain public model"]
    if len(plain) > 1:
        notes.append(f"others: {', '.join(plain[1:])}")
    streaming = [name for name, s in public.items() if s]
    if streaming:
        notes.append(f"streaming: {', '.join(streaming)}")
    return plain[0], "; ".join([*notes, "--model picks another"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--address", default="127.0.0.1", help="the address all three endpoints listen on")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--model", default=None, help="the model the first request goes to (default: the repository's plain model)"
    )
    parser.add_argument("--log-file", type=Path, default=None, help="log to this file (appended) instead of --log-dir")
    parser.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR, help="each run's log file goes here")
    parser.add_argument("--keep-logs", type=int, default=10, help="log files kept in --log-dir, this run's included")
    args = parser.parse_args(argv)
    if args.keep_logs < 1:
        parser.error("--keep-logs must be >= 1")

    if args.log_file is None:
        log_file = new_log_file(args.log_dir, args.keep_logs)
    else:
        log_file = args.log_file
        log_file.parent.mkdir(parents=True, exist_ok=True)
    server = TritonServer(
        args.repository,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        address=args.address,
        log_file=log_file,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    print(f"Starting tritonserver on {args.repository}\nLog: {log_file}", flush=True)
    try:
        seconds = server.start_and_wait(timeout=600)
        print(
            f"Ready in {seconds:.1f} s: HTTP {server.http_url}, gRPC {server.grpc_url}, "
            f"metrics {args.address}:{args.metrics_port}\n"
        )
        model, why = (args.model, "--model") if args.model else choose_model(server.public_models())
        print(f"First request to {model!r} ({why})" if model else f"No first request: {why}")
        if model:
            print(
                f"$ curl -X POST {server.http_url}/v2/models/{model}/generate \\\n    -d '{json.dumps(FIRST_REQUEST)}'"
            )
            print(first_answer(server.http_url, model), "\n", flush=True)
        print("Serving until Ctrl-C.", flush=True)
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(1.0)
        if server.process.poll() is not None:
            print(f"tritonserver exited with code {server.process.returncode}; see {log_file}", file=sys.stderr)
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
