"""Hostile requests get an error naming the problem, in bounded time, while valid requests keep succeeding.

The corpus is tests/support/hostile_requests.py; the fuzz test sends hypothesis-generated /generate bodies. Both run
against the shared server, with a background stream of valid requests that must all succeed.
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hostile_requests import CASES, FRONTEND_PARSE_ERRORS, GRPC_BYTES_CASES, Case
from tests.support.reliability_helpers import CORE_MODEL
from tests.support.triton_helpers import PLAIN_MODEL, env_int, grpc_stream

pytestmark = pytest.mark.server

BOUND_SECONDS = 60  # generous: the machine is shared; a hang is what this catches
VALID = {"text_input": "The quick brown fox", "parameters": {"temperature": 0, "max_tokens": 4}}


@pytest.fixture(scope="module")
def steady_valid_traffic(server):
    """Valid requests in a loop for the whole module; the teardown asserts none failed."""
    stop = threading.Event()
    outcomes: list[str] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                reply = requests.post(
                    f"http://{server.http_url}/v2/models/{PLAIN_MODEL}/generate", json=VALID, timeout=BOUND_SECONDS
                )
                outcomes.append("ok" if reply.status_code == 200 and reply.json()["text_output"] else reply.text)
            except Exception as exc:  # noqa: BLE001 - reported below
                outcomes.append(repr(exc))
            time.sleep(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield outcomes
    stop.set()
    thread.join(timeout=BOUND_SECONDS)
    failures = [o for o in outcomes if o != "ok"]
    print(f"\nvalid requests beside the hostile ones: {len(outcomes)}, failed: {len(failures)}")
    assert outcomes and failures == [], failures[:3]


def _post(server, case: Case) -> requests.Response:
    url = f"http://{server.http_url}/v2/models/{case.model}/{case.endpoint}"
    if case.raw:
        return requests.post(
            url, data=case.payload, headers={"Content-Type": "application/json"}, timeout=BOUND_SECONDS
        )
    return requests.post(url, json=case.payload, timeout=BOUND_SECONDS)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_gets_a_named_error(server, steady_valid_traffic, case):
    start = time.monotonic()
    reply = _post(server, case)
    elapsed = time.monotonic() - start
    assert reply.status_code == case.status, f"{case.name}: {reply.status_code} {reply.text[:300]}"
    error = reply.json().get("error", "")
    assert error, f"{case.name}: no error message"
    assert case.message.lower() in error.lower(), f"{case.name}: error does not name the problem: {error[:300]}"
    assert elapsed < BOUND_SECONDS


@pytest.mark.parametrize("name", sorted(GRPC_BYTES_CASES))
def test_non_utf8_prompt_over_grpc_is_invalid_arg(server, grpc_client, steady_valid_traffic, name):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([GRPC_BYTES_CASES[name]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer(PLAIN_MODEL, [tensor], client_timeout=BOUND_SECONDS)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", info.value
    assert "utf-8" in str(info.value).lower() or "text_input" in str(info.value)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            '{"sampling": {"max_tokens": 4}, "prompt_token_ids": [1, "2"]}',
            "Expected `int`, got `str` - at `$.prompt_token_ids[1]`",
        ),
        ('{"sampling": {"max_tokens": 4}, "prompt": "Hi", "promt": "Hi"}', "Object contains unknown field `promt`"),
    ],
)
def test_the_core_refuses_an_engine_request_of_the_wrong_shape_naming_the_field(
    server, steady_valid_traffic, document, message
):
    """A caller of the core itself (a deployment's own preprocess, or a client) gets the typed decoder's message."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    tensor = grpcclient.InferInput("engine_request", [1, 1], "BYTES")  # the core batches: [batch, 1]
    tensor.set_data_from_numpy(np.array([[document.encode()]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        grpc_stream(server.grpc_url, [tensor], model=CORE_MODEL, timeout=BOUND_SECONDS)
    assert f"engine_request: malformed ({message})" in str(info.value), info.value


_KEYS = [
    "text_input",
    "stream",
    "sampling_parameters",
    "exclude_input_in_output",
    "return_finish_reason",
    "return_logprobs",
    "return_num_output_tokens",
    "temperature",
    "max_tokens",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "logprobs",
    "parameters",
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)),
    max_leaves=8,
)
_bodies = st.dictionaries(st.one_of(st.sampled_from(_KEYS), st.text(max_size=10)), _values, max_size=6)


@settings(
    max_examples=env_int("FUZZ_EXAMPLES", 150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_bodies)
def test_fuzzed_generate_bodies_get_an_answer_never_a_crash(server, steady_valid_traffic, body):
    if isinstance(body.get("parameters"), dict):
        body["parameters"].setdefault("max_tokens", 4)
    reply = requests.post(
        f"http://{server.http_url}/v2/models/{PLAIN_MODEL}/generate",
        data=json.dumps(body, allow_nan=False),
        timeout=BOUND_SECONDS,
    )
    assert reply.status_code in (200, 400, 500), f"{body!r}: {reply.status_code} {reply.text[:300]}"
    if reply.status_code == 500:  # only Triton's own JSON-to-tensor errors (tests/support/hostile_requests.py)
        error = reply.json()["error"]
        assert any(f in error for f in FRONTEND_PARSE_ERRORS) and not error.startswith("internal error"), error
    if reply.status_code == 400:
        assert reply.json()["error"], body
    assert server.process.poll() is None
