"""Stress the plain-infer path (the BLS that drives the decoupled core) with thousands of requests.

STRESS_REQUESTS (default 2000) and STRESS_CONCURRENCY (default 64) size the run; the closing note of the spine
issue reports a 20,000-request run.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from tests.support.triton_helpers import (
    PLAIN_MODEL,
    REFERENCE_PROMPTS,
    env_int,
    grpc_infer,
    grpc_inputs,
    stub_pids,
    text_of,
)

pytestmark = pytest.mark.server

SAMPLING = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


def test_stress_plain_infer_every_response_correct_and_every_stub_alive(server, grpc_client, record_property):
    import tritonclient.grpc.aio as aioclient

    total = env_int("STRESS_REQUESTS", 2000)
    concurrency = env_int("STRESS_CONCURRENCY", 64)
    stubs_before = stub_pids(server.process.pid)
    assert len(stubs_before) >= 4, f"expected the Python stubs in the server's process group: {stubs_before}"
    expected = [text_of(grpc_infer(grpc_client, p, SAMPLING, exclude_input_in_output=True)) for p in REFERENCE_PROMPTS]

    async def run() -> tuple[list[str], list[str]]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        gate = asyncio.Semaphore(concurrency)
        mismatches: list[str] = []
        errors: list[str] = []

        async def one(i: int) -> None:
            k = i % len(REFERENCE_PROMPTS)
            async with gate:
                try:
                    result = await client.infer(
                        PLAIN_MODEL, grpc_inputs(REFERENCE_PROMPTS[k], SAMPLING, exclude_input_in_output=True)
                    )
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    errors.append(f"request {i}: {exc}")
                    return
                text = result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
                if text != expected[k]:
                    mismatches.append(f"request {i}: {text!r} != {expected[k]!r}")

        try:
            await asyncio.gather(*(one(i) for i in range(total)))
        finally:
            await client.close()
        return mismatches, errors

    start = time.monotonic()
    mismatches, errors = asyncio.run(run())
    elapsed = time.monotonic() - start
    record_property("stress_requests_per_second", round(total / elapsed, 1))
    print(f"\nstress: {total} requests at concurrency {concurrency} in {elapsed:.1f} s ({total / elapsed:.0f} req/s)")

    assert errors == [], f"{len(errors)} errors, first: {errors[:3]}"
    assert mismatches == [], f"{len(mismatches)} wrong responses, first: {mismatches[:3]}"
    assert stub_pids(server.process.pid) == stubs_before, "a Python-backend stub died or was restarted"
    assert server.process.poll() is None
    after = grpc_infer(grpc_client, REFERENCE_PROMPTS[0], SAMPLING, exclude_input_in_output=True)
    assert text_of(after) == expected[0]
    assert np.all(after["text_output"] != b"")
