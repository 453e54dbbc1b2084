"""tools/machine_facts.py: what a benchmark ran on, recorded with its results."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import machine_facts
from tools.machine_facts import cpu_facts, cpu_time_delta, describe, interrupt_delta, read_cpu_times, read_interrupts

# /proc/interrupts as a 4-CPU machine writes it: numbered sources (chip, trigger, device), named ones, and ERR / MIS
# with one machine-wide count.
INTERRUPTS = """\
           CPU0       CPU1       CPU2       CPU3
  24:        100          0          0          0  IO-APIC   5-edge      ACPI:Ged
 120:       5000         10          0          0  PCI-MSIX-0000:3b:00.0   0-edge      nvidia
 121:          0          0        700          0  PCI-MSIX-0000:00:05.0   1-edge      virtio3-rx
NMI:          1          2          3          4   Non-maskable interrupts
LOC:       9000       8000       7000       6000   Local timer interrupts
ERR:          0
MIS:          0
"""
LATER = INTERRUPTS.replace("5000         10", "5900         10").replace("9000       8000", "9500       8100")


def test_each_source_is_read_with_its_count_on_each_cpu(tmp_path: Path):
    path = tmp_path / "interrupts"
    path.write_text(INTERRUPTS)
    counts = read_interrupts(path)
    assert counts["120 nvidia"] == [5000, 10, 0, 0]
    assert counts["121 virtio3-rx"] == [0, 0, 700, 0]
    assert counts["LOC Local timer interrupts"] == [9000, 8000, 7000, 6000]
    assert "ERR" not in " ".join(counts) and "MIS" not in " ".join(counts)
    assert read_interrupts(tmp_path / "absent") == {}


def test_the_delta_says_where_interrupts_landed_and_which_sources_fired_most(tmp_path: Path):
    before, after = tmp_path / "before", tmp_path / "after"
    before.write_text(INTERRUPTS)
    after.write_text(LATER)
    delta = interrupt_delta(read_interrupts(before), read_interrupts(after))
    assert delta["per_cpu"] == [1400, 100, 0, 0]
    assert delta["sources"] == {"120 nvidia": [900, 0, 0, 0], "LOC Local timer interrupts": [500, 100, 0, 0]}
    assert list(interrupt_delta(read_interrupts(before), read_interrupts(after), top=1)["sources"]) == ["120 nvidia"]
    # a source that appeared meanwhile (a device's vectors set up during the run) counts from zero
    appeared = {**read_interrupts(after), "130 nvidia": [0, 0, 0, 50]}
    assert interrupt_delta(read_interrupts(before), appeared)["sources"]["130 nvidia"] == [0, 0, 0, 50]


# /proc/stat as a 2-CPU virtual machine writes it: the machine-wide line first, then one per CPU (user nice system
# idle iowait irq softirq steal guest guest_nice), then other counters; a blank line must not stop the reading.
STAT = """\
cpu  3000 0 1000 5000 200 0 100 700 0 0
cpu0 2000 0 500 1000 100 0 50 350 0 0
cpu1 1000 0 500 4000 100 0 50 350 0 0
intr 123456 0 0
ctxt 987654

"""
# 1000 ticks later on each CPU: CPU 0 busy 600 and stolen 300 of them, CPU 1 idle 900 and busy 100
STAT_LATER = STAT.replace("cpu0 2000 0 500 1000 100 0 50 350", "cpu0 2500 0 600 1100 100 0 50 650").replace(
    "cpu1 1000 0 500 4000 100 0 50 350", "cpu1 1080 0 520 4900 100 0 50 350"
)


def test_each_cpus_share_of_busy_and_stolen_time_between_two_readings(tmp_path: Path):
    before, after = tmp_path / "before", tmp_path / "after"
    before.write_text(STAT)
    after.write_text(STAT_LATER)
    assert read_cpu_times(before) == {
        "0": [2000, 0, 500, 1000, 100, 0, 50, 350],
        "1": [1000, 0, 500, 4000, 100, 0, 50, 350],
    }
    assert cpu_time_delta(read_cpu_times(before), read_cpu_times(after)) == {
        "busy_percent": [60.0, 10.0],
        "steal_percent": [30.0, 0.0],
    }
    assert read_cpu_times(tmp_path / "absent") == {}


def test_each_cpus_hyperthread_siblings_and_the_model(tmp_path: Path):
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3", 10: "10"}.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(siblings + "\n")
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9454\nflags\t: fpu\n")
    facts = cpu_facts(tmp_path, cpuinfo)
    assert facts == {
        "model": "AMD EPYC 9454",
        "count": 5,
        "siblings": {"0": "0,2", "1": "1,3", "2": "0,2", "3": "1,3", "10": "10"},
    }
    assert list(facts["siblings"]) == ["0", "1", "2", "3", "10"]  # in the CPUs' order, not the names'


def test_no_nvidia_smi_means_no_gpu_line(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(machine_facts.shutil, "which", lambda name: None)
    assert machine_facts.gpus() == []


def test_a_command_record_is_described_in_a_few_lines():
    command = {
        "command": "bench.py",
        "machine": {
            "gpus": ["NVIDIA H200, 143771 MiB, 580.159.04"],
            "cpus": {"model": "AMD EPYC", "count": 4, "siblings": {"0": "0,2", "1": "1,3", "2": "0,2", "3": "1,3"}},
        },
        "interrupts": {"per_cpu": [1400, 100, 0, 0], "sources": {"120 nvidia": [900, 0, 0, 0]}},
        "cpu_time": {"busy_percent": [99.5, 40.0, 3.0, 0.0], "steal_percent": [0.5, 2.0, 0.0, 0.0]},
    }
    assert describe(command) == [
        "NVIDIA H200, 143771 MiB, 580.159.04; 4 CPUs (AMD EPYC), hyperthread siblings 0,2 1,3",
        "interrupts while it ran, per CPU: 1400 100 0 0",
        "  120 nvidia: 900, 900 of them on CPU 0",
        "busy while it ran, per CPU, %: 99.5 40 3 0",
        "stolen by the hypervisor, per CPU, %: 0.5 2 0 0",
    ]
    assert describe({"command": "an older bench's record"}) == []
