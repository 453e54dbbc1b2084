"""tools/measure_core_outputs.py: an EngineCore step's outputs sent to N clients, timed as vLLM's EngineCoreProc
sends them (vLLM's own encoder, real ZMQ sockets)."""

from __future__ import annotations

import re

from tools.measure_core_outputs import main, step_costs


def test_each_client_count_is_timed_in_turn_each_round(capsys):
    assert main(["--batch", "8", "--steps", "20", "--clients", "1,3", "--rounds", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [re.search(r"(\d+) client", line).group(1) for line in lines] == ["1", "3", "1", "3"]
    for line in lines:
        scheduler, output, together, messages = (float(x) for x in re.findall(r"(\d+\.\d+)", line))
        assert scheduler > 0 and output > 0 and abs(together - (scheduler + output)) <= 0.15
        assert messages == int(re.search(r"(\d+) client", line).group(1))  # one a step to every client


def test_each_step_sends_one_message_to_every_client_with_a_request_in_the_batch():
    assert step_costs(clients=3, batch=8, steps=10)[2] == 30
    assert step_costs(clients=4, batch=2, steps=10)[2] == 20  # two clients have no request: no message


def test_held_outputs_leave_a_message_a_client_only_at_a_requests_first_token_and_end():
    # 2 clients, 4 tokens a request: each 4-step wave sends at its first and last step only
    assert step_costs(clients=2, batch=8, steps=40, hold=False, tokens=4)[2] == 80
    assert step_costs(clients=2, batch=8, steps=40, hold=True, tokens=4)[2] == 40
