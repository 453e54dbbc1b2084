"""core/cpu_placement.py on real processes: the engine-titled one's main thread on the engine's CPU, every other
thread off it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from core.cpu_placement import EnginePlacement, is_engine_process, process_tree

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two CPUs")


def _thread_masks(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


@needs_two_cpus
def test_an_engine_titled_process_s_main_thread_goes_to_the_engine_cpus_and_every_other_thread_off_them():
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpu = cpus[-1]
    # A parent with a thread of its own and two children, one titled as vLLM titles its EngineCore: a Python
    # process with a helper thread, as the EngineCore's busy loop has its socket threads beside it.
    engine = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"
    script = (
        "import subprocess, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "plain = subprocess.Popen(['sleep', '60'])\n"
        f"engine = subprocess.Popen(['bash', '-c', 'exec -a VLLM::EngineCore {sys.executable} -c \"{engine}\"'])\n"
        "print(plain.pid, engine.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        plain_child, engine_child = (int(word) for word in parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (  # until bash has exec'd and the helper thread runs
            is_engine_process(engine_child) and len(os.listdir(f"/proc/{engine_child}/task")) == 2
        ):
            time.sleep(0.01)
        assert set(process_tree(parent.pid)) == {parent.pid, plain_child, engine_child}
        placement = EnginePlacement([engine_cpu])
        engines, others = placement.apply(parent.pid)
        assert engines == [engine_child] and sorted(others) == sorted([parent.pid, plain_child])
        rest = frozenset(cpus) - {engine_cpu}
        main_thread = os.sched_getaffinity(engine_child)
        assert main_thread == {engine_cpu} and _thread_masks(engine_child) == {frozenset({engine_cpu}), rest}
        assert _thread_masks(parent.pid) == {rest} and len(os.listdir(f"/proc/{parent.pid}/task")) >= 2
        assert _thread_masks(plain_child) == {rest}
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_engine_cpus_the_machine_lacks_or_that_leave_the_server_nothing_are_refused():
    with pytest.raises(ValueError, match="this machine has no CPU"):
        EnginePlacement([os.cpu_count() + 3])
    with pytest.raises(ValueError, match="leave at least one"):
        EnginePlacement(os.sched_getaffinity(0))
