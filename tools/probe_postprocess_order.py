"""Probe: does Triton keep a stream's deltas in order when the streaming ensemble's postprocess step has several
instances? (Each delta is a separate postprocess execution; the stage itself is stateless, so only the order in
which Triton delivers the results matters.)

    python tools/probe_postprocess_order.py [--instances 2] [--streams 32] [--rounds 3]

Copies the checked-in repository, sets the postprocess instance count (the renderer refuses more than 1 for this
very reason), serves it on 127.0.0.1 and counts streams whose joined deltas differ from the non-streamed text.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--ready-timeout", type=float, default=600)
    parser.add_argument(
        "--preserve-ordering",
        action="store_true",
        help="add dynamic_batching { preserve_ordering: true } to postprocess",
    )
    args = parser.parse_args(argv)

    import tritonclient.grpc as grpcclient

    from tests.support.triton_helpers import REFERENCE_PROMPTS, grpc_infer, grpc_inputs, grpc_stream, text_of
    from tools.triton_server import TritonServer, free_port

    with tempfile.TemporaryDirectory(prefix="order-probe-") as tmp:
        repository = Path(tmp) / "model_repository"
        shutil.copytree(ROOT / "model_repository", repository)
        (Path(tmp) / "models").symlink_to((ROOT / "models").resolve())  # model.json paths are repository-relative
        config = repository / "postprocess" / "config.pbtxt"
        text, count = re.subn(r"count: 1\n", f"count: {args.instances}\n", config.read_text())
        assert count == 1, "postprocess config.pbtxt: instance count not found"
        if args.preserve_ordering:
            text += "dynamic_batching {\n  preserve_ordering: true\n}\n"
        config.write_text(text)

        log = Path(tmp) / "tritonserver.log"
        server = TritonServer(
            repository,
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
            log_file=log,
            exit_timeout_secs=10,
        )
        with server:
            try:
                server.wait_ready(timeout=args.ready_timeout)
            except (RuntimeError, TimeoutError):
                kept = Path(tempfile.gettempdir()) / "order-probe-failed.log"
                shutil.copy(log, kept)
                print(f"the server did not start; its log: {kept}")
                raise
            client = grpcclient.InferenceServerClient(server.grpc_url)
            sampling = {"temperature": 0, "max_tokens": args.max_tokens, "ignore_eos": True}
            prompts = [REFERENCE_PROMPTS[i % len(REFERENCE_PROMPTS)] for i in range(args.streams)]
            expected = {p: text_of(grpc_infer(client, p, sampling, exclude_input_in_output=True)) for p in set(prompts)}

            def stream(prompt: str) -> bool:
                received = grpc_stream(server.grpc_url, grpc_inputs(prompt, sampling, stream=True))
                return "".join(text_of(outputs) for outputs, _ in received) == expected[prompt]

            bad = 0
            for r in range(args.rounds):
                with ThreadPoolExecutor(args.streams) as pool:
                    ok = list(pool.map(stream, prompts))
                bad += ok.count(False)
                print(f"round {r}: {ok.count(False)} of {len(ok)} streams out of order")
            client.close()
    setup = f"postprocess instances={args.instances} preserve_ordering={args.preserve_ordering}"
    print(f"{setup}: {bad} of {args.streams * args.rounds} streams out of order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
