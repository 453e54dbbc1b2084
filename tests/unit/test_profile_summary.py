"""tools/profile_summary.py: py-spy's raw collapsed stacks summed per thread and per function."""

from __future__ import annotations

from pathlib import Path

from tools.profile_summary import compare, summarise


def test_a_profile_is_summed_by_thread_and_by_function_without_line_numbers(tmp_path: Path):
    raw = tmp_path / "stream-grpc-stub-vllm_core.txt"
    raw.write_text(
        'process 7:"stub";thread (0x1);<module> (/srv/core/engine.py:1);step (/srv/core/engine.py:40) 10\n'
        'process 7:"stub";thread (0x1);<module> (/srv/core/engine.py:1);step (/srv/core/engine.py:41) 20\n'
        'process 7:"stub";thread (0x2);send (/srv/core/stage.py:9);write (/usr/lib/socket.py:3) 10\n'
    )
    text = summarise(raw, top=5)
    assert "40 samples" in text
    assert "thread (0x1) 75%" in text and "thread (0x2) 25%" in text
    self_part, inclusive_part = text.split("top inclusive:")
    assert "75.0%  step (core/engine.py)" in self_part  # lines 40 and 41 are one function
    assert "25.0%  write (lib/socket.py)" in self_part
    assert "75.0%  <module> (core/engine.py)" in inclusive_part and "25.0%  send (core/stage.py)" in inclusive_part


def test_an_empty_profile_says_so(tmp_path: Path):
    raw = tmp_path / "idle.txt"
    raw.write_text("")
    assert "no samples" in summarise(raw, top=5)


def test_compare_names_the_functions_whose_samples_grew_most(tmp_path: Path):
    before, after = tmp_path / "bare.txt", tmp_path / "ours.txt"
    before.write_text(
        'process 1:"engine";thread (0x1): MainThread;loop (/v/core.py:1);schedule (/v/sched.py:5) 10\n'
        'process 1:"engine";thread (0x1): MainThread;loop (/v/core.py:1);forward (/v/model.py:7) 20\n'
        'process 1:"engine";thread (0x2): Thread-2 (inputs);poll (/z/poll.py:3) 5\n'
    )
    after.write_text(
        'process 2:"engine";thread (0x9): MainThread;loop (/v/core.py:1);schedule (/v/sched.py:6) 25\n'
        'process 2:"engine";thread (0x9): MainThread;loop (/v/core.py:1);forward (/v/model.py:7) 22\n'
        'process 2:"engine";thread (0xa): Thread-2 (inputs);poll (/z/poll.py:3) 40\n'
    )
    text = compare(before, after, top=2, thread_filter="MainThread")
    assert "(47 samples) against bare.txt (30 samples)" in text
    self_part, inclusive_part = text.split("most grown, inclusive")
    assert "+15     10     25  schedule (v/sched.py)" in self_part  # lines 5 and 6 are one function
    assert "poll" not in text  # another thread's stacks are left out
    assert "+17     30     47  loop (v/core.py)" in inclusive_part
