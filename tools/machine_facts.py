"""What a benchmark ran on, recorded with its results (tools/bench.py): the GPUs, the CPUs with their hyperthread
siblings, and, while the command ran, where the machine's interrupts landed, how busy each CPU was and how much of
its time the hypervisor gave to others (steal).

The benchmark deployment places vLLM's EngineCore loop alone on one CPU (core.engine_cpus). Whether that CPU shares
its core with a busy sibling, takes the GPU's and the network's interrupts, or runs on a host core that the
hypervisor also gives to others, is a property of the lent machine, not of the serving code, and it changes how
fast the loop runs: each results file says it for its own machine.
Linux only (/proc, /sys); elsewhere the facts are empty. Triton-free and vLLM-free.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

CPU_ROOT = Path("/sys/devices/system/cpu")
CPUINFO = Path("/proc/cpuinfo")
INTERRUPTS = Path("/proc/interrupts")
PROC_STAT = Path("/proc/stat")
TOP_SOURCES = 8  # the interrupt sources recorded per command: those that fired most while it ran


def gpus() -> list[str]:
    """One line per GPU: name, memory, driver (nvidia-smi's); [] without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        out = subprocess.run([smi, *query], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cpu_facts(cpu_root: Path = CPU_ROOT, cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """The CPUs' model, and each CPU's hyperthread siblings (itself included) as the kernel lists them."""
    model = ""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    siblings: dict[str, str] = {}
    for topology in sorted(cpu_root.glob("cpu[0-9]*/topology"), key=lambda p: int(p.parent.name[3:])):
        try:
            siblings[topology.parent.name[3:]] = (topology / "thread_siblings_list").read_text().strip()
        except OSError:
            continue
    return {"model": model, "count": len(siblings), "siblings": siblings}


def read_interrupts(path: Path = INTERRUPTS) -> dict[str, list[int]]:
    """/proc/interrupts: each source ("24 ttyS0", "LOC Local timer interrupts") -> its count on each CPU."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    if not lines:
        return {}
    cpus = len(lines[0].split())
    counts: dict[str, list[int]] = {}
    for line in lines[1:]:
        irq, _, rest = line.partition(":")
        fields = rest.split()
        per_cpu = []
        for field in fields[:cpus]:
            if not field.isdigit():
                break
            per_cpu.append(int(field))
        description = fields[len(per_cpu) :]
        if not per_cpu or not description:
            continue  # ERR, MIS: one machine-wide count
        irq = irq.strip()
        # a numbered line's description is its chip and trigger, then the device's name: the name says enough
        name = description[-1] if irq.isdigit() else " ".join(description)
        counts[f"{irq} {name}"] = per_cpu + [0] * (cpus - len(per_cpu))
    return counts


def interrupt_delta(before: dict[str, list[int]], after: dict[str, list[int]], top: int = TOP_SOURCES) -> dict:
    """What fired between two readings: the count per CPU, and the `top` sources that fired most, per CPU."""
    deltas = {
        source: [now - then for now, then in zip(counts, before.get(source, [0] * len(counts)), strict=False)]
        for source, counts in after.items()
    }
    width = max((len(d) for d in deltas.values()), default=0)
    per_cpu = [sum(d[cpu] for d in deltas.values() if cpu < len(d)) for cpu in range(width)]
    busiest = sorted(deltas.items(), key=lambda item: sum(item[1]), reverse=True)[:top]
    return {"per_cpu": per_cpu, "sources": {source: d for source, d in busiest if sum(d) > 0}}


def read_cpu_times(path: Path = PROC_STAT) -> dict[str, list[int]]:
    """/proc/stat's per-CPU lines: each CPU ("0", "1", ...) -> its clock ticks (user nice system idle iowait irq
    softirq steal; the guest columns are inside user and nice)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    times = {}
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit():
            times[name[3:]] = [int(field) for field in fields[:8]]
    return times


# /proc/stat's idle, iowait and steal columns: a CPU's ticks that are not its own work (the rest are busy)
NOT_BUSY_COLUMNS = (3, 4, 7)


def busy_ticks(columns: list[int]) -> int:
    """A CPU's busy clock ticks in a reading of read_cpu_times (or the difference of two)."""
    return sum(columns) - sum(columns[i] for i in NOT_BUSY_COLUMNS if i < len(columns))


def cpu_time_delta(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, list[float]]:
    """Each CPU's share of the time between two readings, in per cent: busy (neither idle nor waiting for I/O nor
    stolen) and stolen (the hypervisor ran something else on its host core while it wanted to run)."""
    busy, steal = [], []
    for cpu, now in sorted(after.items(), key=lambda item: int(item[0])):
        then = before.get(cpu, [0] * len(now))
        ticks = [a - b for a, b in zip(now, then, strict=False)] + [0] * 8
        total = sum(ticks[:8]) or 1
        busy.append(round(100 * busy_ticks(ticks[:8]) / total, 1))
        steal.append(round(100 * ticks[7] / total, 1))
    return {"busy_percent": busy, "steal_percent": steal}


def machine_facts() -> dict[str, Any]:
    return {"gpus": gpus(), "cpus": cpu_facts()}


def describe(command: dict[str, Any]) -> list[str]:
    """A results file's command record (its `machine`, `interrupts` and `cpu_time`) in a few lines; [] for an
    older record."""
    machine, interrupts, cpu_time = command.get("machine"), command.get("interrupts"), command.get("cpu_time")
    lines = []
    if machine:
        cpus = machine["cpus"]
        shared = sorted({s for s in cpus["siblings"].values() if "," in s or "-" in s})
        smt = f"hyperthread siblings {' '.join(shared)}" if shared else "no CPU shares its core"
        gpu = "; ".join(machine["gpus"]) or "no GPU found"
        lines.append(f"{gpu}; {cpus['count']} CPUs ({cpus['model'] or 'model unknown'}), {smt}")
    if interrupts and interrupts["per_cpu"]:
        per_cpu = " ".join(str(n) for n in interrupts["per_cpu"])
        lines.append(f"interrupts while it ran, per CPU: {per_cpu}")
        for source, counts in interrupts["sources"].items():
            cpu = max(range(len(counts)), key=counts.__getitem__)
            lines.append(f"  {source}: {sum(counts)}, {counts[cpu]} of them on CPU {cpu}")
    if cpu_time and cpu_time["busy_percent"]:
        lines.append(f"busy while it ran, per CPU, %: {' '.join(f'{p:g}' for p in cpu_time['busy_percent'])}")
        lines.append(f"stolen by the hypervisor, per CPU, %: {' '.join(f'{p:g}' for p in cpu_time['steal_percent'])}")
    return lines
