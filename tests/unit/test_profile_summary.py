"""tools/profile_summary.py: py-spy's raw collapsed stacks summed per thread and per function."""

from __future__ import annotations

from pathlib import Path

from tools.profile_summary import summarise


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
