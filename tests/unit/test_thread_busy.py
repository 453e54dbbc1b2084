"""tools/thread_busy.py: a process's busiest threads, and how long each was busy at a stretch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tools.thread_busy import BUSY, busiest_threads, main, sample, summarize, thread_name


def test_runs_of_full_windows_are_counted_and_the_longest_kept():
    busy = summarize([0.1, BUSY, 1.0, 0.95, 0.2, 1.0, 0.0])
    assert (busy.full_windows, busy.windows, busy.longest_full_run) == (4, 7, 3)
    assert busy.mean == pytest.approx(sum([0.1, BUSY, 1.0, 0.95, 0.2, 1.0, 0.0]) / 7)
    assert summarize([]).windows == 0 and summarize([]).mean == 0.0


@pytest.fixture
def spinning():
    """A process whose thread named 'spinner' keeps a CPU busy while its main thread sleeps."""
    code = textwrap.dedent(
        """
        import threading, time
        def spin():
            threading.current_thread().name = "spinner"
            import ctypes
            ctypes.CDLL(None).prctl(15, b"spinner", 0, 0, 0)  # PR_SET_NAME: the thread's comm
            end = time.monotonic() + 30
            while time.monotonic() < end:
                pass
        threading.Thread(target=spin, daemon=True).start()
        print("ready", flush=True)
        time.sleep(30)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


def test_the_spinning_thread_is_picked_first_and_found_busy(spinning):
    tids = busiest_threads(spinning.pid, 0.3, top=2)
    assert thread_name(spinning.pid, tids[0]) == "spinner"
    shares = sample(spinning.pid, tids, 0.3, 0.01)
    # on a loaded machine the spinner gets less than a whole CPU, but far more than the sleeping main thread
    assert summarize(shares[tids[0]]).mean > 0.3
    assert summarize(shares[tids[0]]).windows >= 10
    if len(tids) > 1:
        assert summarize(shares[tids[1]]).mean < 0.1


def test_it_prints_a_line_per_thread_and_refuses_a_missing_process(spinning, capsys):
    assert main([str(spinning.pid), "--seconds", "0.2", "--pick-seconds", "0.2", "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"2 busiest threads of {spinning.pid}") and "spinner" in lines[1]
    with pytest.raises(SystemExit):
        main(["999999999"])
