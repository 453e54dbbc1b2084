"""Whether the EngineCore's output thread keeps up with a busy loop when each step's outputs go to N clients.

    python tools/measure_output_thread.py [--step-ms 2.8] [--batch 64] [--steps 1500] [--clients 1,4,8]
        [--switch-interval-ms 5] [--release-every-us 50] [--rounds 2]

vLLM's EngineCoreProc runs its scheduler and model on one thread, a busy loop that holds the GIL but for short
releases (a torch call, the wait for the GPU), and queues each step's outputs, one EngineCoreOutputs per client with
a request in the batch; its output thread takes each from the queue, encodes it (MsgpackEncoder) and sends it on that
client's ZMQ socket, a GIL-free call. Each message thus needs the GIL back from the busy loop, which a waiting thread
gets when the loop lets go at the right moment or, failing that, after the switch interval (Python's 5 ms in the
EngineCore). With the plain model's 8 instances a step's outputs are 8 messages where the bare engine's are one.

Here the busy loop is emulated: `--step-ms` of pure-Python work a step, the GIL let go for a moment every
`--release-every-us`; then the step's outputs (each request one new token, the batch dealt over the clients) are
queued for an output thread written as vLLM's. A separate process receives every client's messages and records how
long after its step ended each arrived (the outputs' own `timestamp`, the system's monotonic clock). Printed per
client count: the loop's time a step (its work and what the output thread took from it), and the delivery lag of a
step's last message (median, p99, and over the run's first and last tenth: a lag that grows means the thread falls
behind the steps). Needs vLLM and pyzmq, no GPU; on a machine of few CPUs the receiving process shares them.
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import zmq

DONE = b"done"


def _receive(paths: list[str], expected: int, results: Any) -> None:
    """In its own process: every client's socket, each message's lag after its step ended, by step."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder

    decoder = MsgpackDecoder(EngineCoreOutputs)
    context = zmq.Context()
    sockets = []
    poller = zmq.Poller()
    for path in paths:
        socket = context.socket(zmq.PULL)
        socket.connect(path)
        poller.register(socket, zmq.POLLIN)
        sockets.append(socket)
    time.sleep(0.2)  # the connections made
    results.put("ready")
    last_lag: dict[int, float] = {}  # step -> the lag of its last message to arrive
    received = 0
    deadline = time.monotonic() + 600
    while received < expected and time.monotonic() < deadline:
        for socket, _ in poller.poll(1000):
            frames = socket.recv_multipart(copy=False)
            now = time.monotonic()
            outputs = decoder.decode(frames)
            step = int(outputs.outputs[0].new_token_ids[0])
            last_lag[step] = max(last_lag.get(step, 0.0), now - outputs.timestamp)
            received += 1
    results.put([last_lag[step] for step in sorted(last_lag)])
    for socket in sockets:
        socket.close(0)
    context.term()


def _output_thread(outbox: queue.Queue, sockets: list[zmq.Socket]) -> None:
    """vLLM's EngineCoreProc.process_output_sockets, without its buffer reuse and tracking."""
    from vllm.v1.serial_utils import MsgpackEncoder

    encoder = MsgpackEncoder()
    while True:
        item = outbox.get()
        if item is None:
            return
        client, outputs = item
        sockets[client].send_multipart(encoder.encode_into(outputs, bytearray()), copy=False)


def _busy(seconds: float, release_every: float) -> None:
    """Pure-Python work for `seconds` of wall time, the GIL let go for a moment every `release_every` seconds."""
    end = time.perf_counter() + seconds
    next_release = time.perf_counter() + release_every
    x = 0
    while (now := time.perf_counter()) < end:
        for i in range(50):
            x += i * i
        if release_every and now >= next_release:
            time.sleep(0)  # a GIL-free call, as a torch op or the wait for the GPU
            next_release = now + release_every


def run(clients: int, batch: int, steps: int, step_ms: float, release_every_us: float) -> tuple[float, list[float]]:
    """(the loop's mean ms a step, each step's last delivery lag in seconds)."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder  # noqa: F401  (imported here: the forked receiver has it)

    folder = tempfile.mkdtemp(prefix="output-thread-")
    paths = [f"ipc://{folder}/client-{index}" for index in range(clients)]
    # Forked before this process has a ZMQ context or threads (the receiver makes its own), with vLLM imported
    forked = multiprocessing.get_context("fork")
    results: Any = forked.Queue()
    receiver = forked.Process(target=_receive, args=(paths, steps * min(clients, batch), results))
    receiver.start()
    context = zmq.Context()
    sockets = []
    for path in paths:
        socket = context.socket(zmq.PUSH)
        socket.bind(path)
        sockets.append(socket)
    if results.get(timeout=120) != "ready":  # the receiver has connected (ZMQ lets it connect before the bind)
        raise RuntimeError("the receiving process did not start")
    outbox: queue.Queue = queue.Queue()
    thread = threading.Thread(target=_output_thread, args=(outbox, sockets), daemon=True)
    thread.start()
    request_ids = [f"request-{index}" for index in range(batch)]
    try:
        start = time.perf_counter()
        for step in range(steps):
            _busy(step_ms / 1000, release_every_us / 1e6)
            per_client: dict[int, list] = {}
            for index, request_id in enumerate(request_ids):
                output = EngineCoreOutput(request_id=request_id, new_token_ids=[step])
                per_client.setdefault(index % clients, []).append(output)
            stamp = time.monotonic()
            for client, outputs in per_client.items():
                outbox.put_nowait((client, EngineCoreOutputs(outputs=outputs, timestamp=stamp)))
        loop_ms = 1000 * (time.perf_counter() - start) / steps
        outbox.put(None)
        thread.join()
        lags = results.get(timeout=120)
        receiver.join(timeout=30)
    finally:
        if receiver.is_alive():
            receiver.kill()
        for socket in sockets:
            socket.close(0)
        context.term()
        shutil.rmtree(folder)
    return loop_ms, lags


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:7.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--step-ms", type=float, default=2.8, help="the busy loop's work a step (256 x 64 on an H200)")
    parser.add_argument("--batch", type=int, default=64, help="requests in the step's batch")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    parser.add_argument("--switch-interval-ms", type=float, default=5.0, help="this process's (Python's default 5)")
    parser.add_argument("--release-every-us", type=float, default=50.0, help="0: the loop never lets go of the GIL")
    parser.add_argument("--rounds", type=int, default=2, help="each client count this many times, in turn")
    args = parser.parse_args(argv)
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    print(
        f"busy loop {args.step_ms} ms a step, GIL let go every {args.release_every_us:g} us, switch interval"
        f" {args.switch_interval_ms:g} ms; ms: the loop's step; a step's last delivery lag median, p99, first and last"
        " tenth's median"
    )
    for _ in range(args.rounds):
        for clients in args.clients:
            loop_ms, lags = run(clients, args.batch, args.steps, args.step_ms, args.release_every_us)
            tenth = max(1, len(lags) // 10)
            p99 = sorted(lags)[int(0.99 * (len(lags) - 1))]
            print(
                f"{clients:2d} client(s): step {loop_ms:6.2f}  lag {_ms(statistics.median(lags))} {_ms(p99)}"
                f"  first {_ms(statistics.median(lags[:tenth]))} last {_ms(statistics.median(lags[-tenth:]))}"
                f"  ({len(lags)} steps)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
