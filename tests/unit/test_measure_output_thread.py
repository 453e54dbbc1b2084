"""tools/measure_output_thread.py: a busy loop's step outputs sent to N clients by an output thread written as
vLLM's, received in another process (vLLM's own encoder and decoder, real ZMQ sockets)."""

from __future__ import annotations

import re

from tools.measure_output_thread import main, run


def test_every_step_is_delivered_and_its_lag_measured():
    loop_ms, lags = run(clients=3, batch=4, steps=20, step_ms=0.5, release_every_us=50)
    assert loop_ms >= 0.5  # at least the loop's own work a step
    assert len(lags) == 20  # one lag a step: its last message's, however many clients it went to
    assert all(0 <= lag < 5 for lag in lags)


def test_each_client_count_is_run_in_turn_each_round(capsys):
    assert main(["--batch", "4", "--steps", "10", "--step-ms", "0.2", "--clients", "1,2", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "switch interval 5 ms" in lines[0]
    assert [re.search(r"(\d+) client", line).group(1) for line in lines[1:]] == ["1", "2", "1", "2"]
    assert all("(10 steps)" in line for line in lines[1:])
