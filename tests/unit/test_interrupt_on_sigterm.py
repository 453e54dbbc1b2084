"""tools/triton_server.interrupt_on_sigterm: SIGTERM unwinds like Ctrl-C (the `finally` that stops a server runs),
and a handler the program set itself is kept. Each case runs in a fresh interpreter: signal handlers are
process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


# GNU `timeout` signals the command, then its process group: the second may arrive while the first unwinds
@pytest.mark.parametrize("second", ["", "os.kill(os.getpid(), signal.SIGTERM)"], ids=["once", "twice, as timeout"])
def test_sigterm_runs_the_finally_blocks_that_stop_servers(second: str):
    result = _run(
        f"""
        import os, signal, time
        from tools.triton_server import interrupt_on_sigterm
        interrupt_on_sigterm()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            print("not interrupted")
        except KeyboardInterrupt:
            print("interrupted")
        finally:
            {second}
            time.sleep(0.2)
            print("stopped the servers")
        """
    )
    assert result.stdout.split() == ["interrupted", "stopped", "the", "servers"], result.stderr


def test_a_handler_of_the_programs_own_is_kept():
    result = _run(
        """
        import os, signal, time
        from tools.triton_server import interrupt_on_sigterm
        signal.signal(signal.SIGTERM, lambda *_: print("own handler"))
        interrupt_on_sigterm()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("went on")
        """
    )
    assert result.stdout.splitlines()[:2] == ["own handler", "went on"], result.stderr
