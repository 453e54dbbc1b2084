"""The benchmark's paths (tools/bench.py): which are streamed, the client each is measured with, the bare path it is
held against, the engine that serves it, and the order of --interleave's turn. Facts about names, shared by the
run and by what reads its results."""

from __future__ import annotations

STREAMED_PATHS = (
    "bare-stream",
    "bare-front-ends-stream",
    "vllm-serve-stream",
    "stream-grpc",
    "stream-grpc-per-request",
    "vllm-backend-stream",
)
BARE_PATHS = ("bare", "bare-stream")
BARE_WORKER_PATHS = (*BARE_PATHS, "bare-delayed")  # the paths the bare engine's worker serves
FRONT_END_PATHS = ("bare-front-ends", "bare-front-ends-stream")
TRITON_PATHS = ("plain-grpc", "plain-http", "stream-grpc", "stream-grpc-per-request", "vllm-backend-stream")


# The client each path is measured with: a kind of tools/bench_clients.py, or the bare engine's own in this process.
# Every run records it, and --merge refuses to add runs of a path to a file whose runs of it used another client. A
# client that changes how it measures gets a new kind name (before ad62c4b, grpc-stream opened a stream per request;
# runs of that time record no client).
PATH_CLIENTS = {
    "bare": "in-process",
    "bare-stream": "in-process",
    "bare-delayed": "in-process-delayed",
    "bare-front-ends": "engine-front-end",
    "bare-front-ends-stream": "engine-front-end-stream",
    "vllm-serve": "openai",
    "vllm-serve-stream": "openai-stream",
    "plain-grpc": "grpc-infer",
    "plain-http": "http-generate",
    "stream-grpc": "grpc-stream",
    "stream-grpc-per-request": "grpc-stream-per-request",
    "vllm-backend-stream": "grpc-stream",
}


def client_of(path: str) -> str:
    if path.startswith("extra:"):
        return "grpc-infer"
    if path.startswith("extra-stream:"):
        return "grpc-stream"
    return PATH_CLIENTS[path]


BARE_DELAY_MS = 40.0  # --bare-delay-ms's default


def recorded_client(path: str, bare_delay_ms: float) -> str:
    """The client a run of `path` records: client_of's, bare-delayed's with its longest hold (runs with other holds
    are not repetitions of one measurement, so --merge refuses to mix them as it refuses another client)."""
    client = client_of(path)
    return f"{client}-{bare_delay_ms:g}ms" if path == "bare-delayed" else client


def is_streamed(path: str) -> bool:
    return path in STREAMED_PATHS or path.startswith("extra-stream:")


def baseline_of(path: str) -> str:
    return "bare-stream" if is_streamed(path) else "bare"


# The paths that ours are compared with besides the bare engine (a target each, or a split of the gap)
COMPARED_PATHS = ("vllm-serve", "vllm-serve-stream", "vllm-backend-stream", "bare-delayed", *FRONT_END_PATHS)


def engine_groups(paths: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """`paths` by the engine that serves them: the bare worker, the front ends of one EngineCore, `vllm serve`,
    the Triton server (one group each; a group's engine starts once per command)."""
    return (
        [p for p in paths if p in BARE_WORKER_PATHS],
        [p for p in paths if p in FRONT_END_PATHS],
        [p for p in paths if p.startswith("vllm-serve")],
        [p for p in paths if p in TRITON_PATHS or p.startswith("extra")],
    )


def turn_order(paths: list[str]) -> list[str]:
    """The order of --interleave's turn: each of our paths beside its bare baseline and beside the path it is held
    against, the two bare paths in the middle: [vllm-serve, plain-grpc, bare | bare-stream, stream-grpc,
    vllm-serve-stream]. The spread of a paired ratio grows with how far apart in the turn its two paths are
    (tools/pair_spread.py over the H100 runs: at 64 and 256 streams, bare / plain-grpc 0.126 beside each other,
    0.158 four places apart, as rms of the log ratio); the order before (bare, bare-stream, vllm-serve, ..., ours
    last) put the two main targets' pairs four places apart in a run of six paths."""

    def side(plain: bool) -> list[str]:
        mine = [p for p in paths if baseline_of(p) == ("bare" if plain else "bare-stream")]
        compared = [p for p in mine if p in COMPARED_PATHS]
        ours = [p for p in mine if p not in COMPARED_PATHS and p not in BARE_PATHS]
        bare = [p for p in mine if p in BARE_PATHS]
        return [*compared, *ours, *bare] if plain else [*bare, *ours, *compared[::-1]]

    return [*side(True), *side(False)]
