"""What one EngineCore step's outputs cost the EngineCore's process when its batch belongs to N clients (the core's
front ends, the plain model's instances) instead of one (the bare engine's own client).

    python tools/measure_core_outputs.py [--batch 64] [--steps 3000] [--clients 1,4,8,12] [--rounds 3] [--hold]
        [--tokens 64]

Per step, as vLLM's EngineCoreProc does it: the scheduler's side groups the step's outputs by client and queues one
EngineCoreOutputs per client; the output thread encodes each (vLLM's MsgpackEncoder, into a buffer) and sends it on
that client's ZMQ PUSH socket. Both are timed in one thread (`time.thread_time`: CPU, not wall) with each output one
new token, as a decode step's are; the receivers are threads of this process, not counted. It needs vLLM and pyzmq,
no GPU. The difference between N clients and one is what the EngineCore's CPU-bound loop pays per step for the
server's arrangement of its clients, to set against the step's own time (~2.5 ms at 64 streams on the H200).

Each request generates --tokens tokens (the batch's requests end together, then new ones take their place). With
--hold each count is timed twice, as it is and with core.hold_outputs_in_engine (core/engine_hold.py's OutputHolder
on the output thread, as core/engine_hold_install.py puts it there; the requests non-streamed): what holding costs or
saves the output thread per step, and the messages the clients still get.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import tempfile
import threading
import time
from types import SimpleNamespace

import zmq


def _drain(socket: zmq.Socket, stop: threading.Event, received: list[int]) -> None:
    poller = zmq.Poller()
    poller.register(socket, zmq.POLLIN)
    while not stop.is_set():
        if poller.poll(50):
            socket.recv_multipart(copy=False)
            received.append(1)


def step_costs(clients: int, batch: int, steps: int, hold: bool = False, tokens: int = 64) -> tuple[float, float, int]:
    """(the scheduler's side, the output thread's) in microseconds of CPU per step, and how many messages the
    clients received (without `hold` each step one for every client with a request in the batch)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackEncoder

    from core.engine_hold import OutputHolder

    context = zmq.Context()
    folder = tempfile.mkdtemp(prefix="core-outputs-")
    senders, receivers = [], []
    for index in range(clients):
        path = f"ipc://{folder}/client-{index}"
        sender = context.socket(zmq.PUSH)
        sender.bind(path)
        receiver = context.socket(zmq.PULL)
        receiver.connect(path)
        senders.append(sender)
        receivers.append(receiver)
    stop = threading.Event()
    received: list[int] = []  # list.append is atomic: the receivers' threads share it
    threads = [threading.Thread(target=_drain, args=(r, stop, received), daemon=True) for r in receivers]
    for thread in threads:
        thread.start()
    final_only = SimpleNamespace(
        sampling_params=SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY), pooling_params=None
    )
    running: dict[str, SimpleNamespace] = {}  # the scheduler's requests, as the holder looks them up
    holder = OutputHolder(running.get, stream_interval=1) if hold else None
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    encoder = MsgpackEncoder()
    scheduler = output = 0.0
    sent = 0
    try:
        for step in range(steps):
            start = time.thread_time()
            wave, position = divmod(step, tokens)
            request_ids = [f"triton-{wave}-{index}" for index in range(batch)]
            if position == 0:
                running.clear()
                running.update(dict.fromkeys(request_ids, final_only))
            finish = "length" if position == tokens - 1 else None
            per_client: dict[int, list] = {}
            for index, request_id in enumerate(request_ids):
                token = EngineCoreOutput(request_id=request_id, new_token_ids=[step % 1000], finish_reason=finish)
                per_client.setdefault(index % clients, []).append(token)
            for client, outputs in per_client.items():
                outbox.put((client, EngineCoreOutputs(outputs=outputs, timestamp=time.monotonic())))
            queued = time.thread_time()
            while True:
                try:
                    client, outputs = outbox.get_nowait()
                except queue.Empty:
                    break
                if holder is None or holder.keeps(outputs):  # held on the output thread, as the core installs it
                    senders[client].send_multipart(encoder.encode_into(outputs, bytearray()), copy=False)
                    sent += 1
            scheduler += queued - start
            output += time.thread_time() - queued
        deadline = time.monotonic() + 5
        while len(received) < sent and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for socket in senders + receivers:
            socket.close(0)
        context.term()
        shutil.rmtree(folder)
    return 1e6 * scheduler / steps, 1e6 * output / steps, len(received)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="requests in the step's batch")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 12])
    parser.add_argument("--rounds", type=int, default=3, help="each client count this many times, in turn")
    parser.add_argument("--hold", action="store_true", help="also with core.hold_outputs_in_engine (non-streamed)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens each request generates")
    args = parser.parse_args(argv)
    for _ in range(args.rounds):
        for clients in args.clients:
            for hold in (False, True) if args.hold else (False,):
                scheduler, output, messages = step_costs(clients, args.batch, args.steps, hold, args.tokens)
                print(
                    f"batch {args.batch}, {clients:2d} client(s){', held' if hold else ''}: scheduler's side"
                    f" {scheduler:6.1f} us a step, output thread {output:6.1f}, together {scheduler + output:6.1f};"
                    f" {messages / args.steps:.2f} messages a step"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
