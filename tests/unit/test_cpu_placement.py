"""core/cpu_placement.py on real processes: the engine-titled one's main thread on the engine's CPU, every other
thread off it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from core.cpu_placement import EnginePlacement, is_engine_process, pin_process, process_tree

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placement needs two CPUs")


def _thread_masks(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


# An engine-titled Python process with a helper thread, as the EngineCore's busy loop has its socket threads beside it
ENGINE = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)"


@contextlib.contextmanager
def _server(engines: int) -> Iterator[tuple[int, int, list[int]]]:
    """A parent with a thread of its own and children: a plain one and `engines` titled as vLLM titles its
    EngineCore. Yields (parent, plain child, engine children) once each engine's helper thread runs."""
    script = (
        "import subprocess, threading, time\n"
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "plain = subprocess.Popen(['sleep', '60'])\n"
        f"engines = [subprocess.Popen(['bash', '-c', 'exec -a VLLM::EngineCore {sys.executable} -c \"{ENGINE}\"'])"
        f" for _ in range({engines})]\n"
        "print(plain.pid, *(e.pid for e in engines), flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        plain_child, *engine_children = (int(word) for word in parent.stdout.readline().split())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(  # until bash has exec'd and the helper thread runs
            is_engine_process(pid) and len(os.listdir(f"/proc/{pid}/task")) == 2 for pid in engine_children
        ):
            time.sleep(0.01)
        yield parent.pid, plain_child, engine_children
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


@needs_two_cpus
def test_an_engine_titled_process_s_main_thread_goes_to_the_engine_cpus_and_every_other_thread_off_them():
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpu = cpus[-1]
    with _server(engines=1) as (parent, plain_child, [engine_child]):
        assert set(process_tree(parent)) == {parent, plain_child, engine_child}
        placement = EnginePlacement([engine_cpu])
        engines, others = placement.apply(parent)
        assert engines == [engine_child] and sorted(others) == sorted([parent, plain_child])
        rest = frozenset(cpus) - {engine_cpu}
        main_thread = os.sched_getaffinity(engine_child)
        assert main_thread == {engine_cpu} and _thread_masks(engine_child) == {frozenset({engine_cpu}), rest}
        assert _thread_masks(parent) == {rest} and len(os.listdir(f"/proc/{parent}/task")) >= 2
        assert _thread_masks(plain_child) == {rest}


@needs_two_cpus
def test_another_deployment_s_placed_engine_keeps_its_main_thread_s_cpus():
    # Two deployments' cores in one server, both with the same engine CPU (tools/bench.py --also-deployment): the
    # second core's pass must not move the first one's engine loop off the CPU the first core gave it.
    cpus = sorted(os.sched_getaffinity(0))
    engine_cpu = cpus[-1]
    rest = frozenset(cpus) - {engine_cpu}
    with _server(engines=3) as (parent, plain_child, [first, second, unplaced]):
        first_engines, _ = EnginePlacement([engine_cpu]).apply(parent, engine_root=first)
        assert first_engines == [first] and _thread_masks(first) == {frozenset({engine_cpu}), rest}
        # An engine whose deployment has no engine_cpus: all its threads alike (here back on every CPU)
        pin_process(unplaced, cpus)
        second_engines, others = EnginePlacement([engine_cpu]).apply(parent, engine_root=second)
        assert second_engines == [second] and sorted(others) == sorted([parent, plain_child, first, unplaced])
        assert _thread_masks(second) == {frozenset({engine_cpu}), rest}
        assert os.sched_getaffinity(first) == {engine_cpu} and _thread_masks(first) == {frozenset({engine_cpu}), rest}
        assert _thread_masks(unplaced) == {rest}  # not placed by its core: an ordinary process, off the engine CPU
        assert _thread_masks(plain_child) == {rest} and _thread_masks(parent) == {rest}


def test_engine_cpus_the_machine_lacks_or_that_leave_the_server_nothing_are_refused():
    with pytest.raises(ValueError, match="this machine has no CPU"):
        EnginePlacement([os.cpu_count() + 3])
    with pytest.raises(ValueError, match="leave at least one"):
        EnginePlacement(os.sched_getaffinity(0))
