"""The GPU's clocks, power and temperature while each benchmark measurement ran (tools/bench.py).

Over a lease the same engine's tok/s moves by more than the gaps the benchmark judges, and sometimes one path's
whole repetition runs several times slower than its others (every request of the round, not a few). Whether such a
slow spell is the GPU's (its SM clock pulled down: power or thermal limits, a hardware slowdown) or the host's is a
question of the machine, not of the serving code: `nvidia-smi --loop-ms` samples the first visible GPU every
SAMPLE_MS, each sample with nvidia-smi's own timestamp (its arrival time where that does not parse: a piped
nvidia-smi may hold lines back), and each measurement keeps a summary of the samples inside its own start and end.
No nvidia-smi (the CPU machine): nothing is sampled, nothing recorded.
Triton-free and vLLM-free.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SAMPLE_MS = 200
SETTLE_INTERVALS = 3  # how long `between` waits for a window's last samples, in sample intervals
# nvidia-smi's names: clocks_event_reasons since driver 535, clocks_throttle_reasons before (the same bits)
QUERIES = (
    "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active",
    "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active",
)
TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's, in local time
# NVML's clocks event reasons (nvmlClocksEventReason*): why the SM clock is below its maximum
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that pull the clock down under load (an applications-clocks setting holds it where it was set)
SLOWDOWNS = frozenset(
    {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)
# A measurement whose median SM clock is below this share of the run's is listed: its median, not its lowest sample,
# as the GPU drops its clock within a fraction of a second idle (345 MHz against 1980 on an idle H200) and a wave of
# requests may end between two samples
SLOW_CLOCK = 0.9
MAX_LISTED = 12


@dataclass(frozen=True)
class Sample:
    at: float  # the sample's time as time.time() gives it
    sm_mhz: float | None
    mem_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    utilization: float | None
    reasons: int


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_line(line: str, arrived: float) -> Sample | None:
    """One line of `--format=csv,noheader,nounits` for QUERIES' fields; None for anything else."""
    parts = [part.strip() for part in line.split(",")]
    if len(parts) != 7:
        return None
    try:
        at = datetime.strptime(parts[0], TIMESTAMP_FORMAT).timestamp()
    except ValueError:
        at = arrived
    try:
        reasons = int(parts[6], 16)
    except ValueError:
        reasons = 0
    sm, mem, power, temperature, utilization = (_number(part) for part in parts[1:6])
    if sm is None:
        return None
    return Sample(at, sm, mem, power, temperature, utilization, reasons)


def reason_names(bits: int) -> list[str]:
    return [name for bit, name in REASONS.items() if bits & bit] + ([f"0x{bits:x}"] if bits >= 0x200 else [])


def summarize(samples: Sequence[Sample]) -> dict[str, Any] | None:
    """A measurement's samples in a few numbers: its SM clock's median and lowest, the memory clock's lowest, power
    and utilization's medians, the hottest temperature, and every reason but idleness that held the clock down."""
    if not samples:
        return None

    def values(name: str) -> list[float]:
        return [value for sample in samples if (value := getattr(sample, name)) is not None]

    def median(name: str) -> float | None:
        found = values(name)
        return round(statistics.median(found), 1) if found else None

    def lowest(name: str) -> float | None:
        found = values(name)
        return min(found) if found else None

    temperatures = values("temperature_c")
    bits = 0
    for sample in samples:
        bits |= sample.reasons
    return {
        "samples": len(samples),
        "sm_mhz_median": median("sm_mhz"),
        "sm_mhz_min": lowest("sm_mhz"),
        "mem_mhz_min": lowest("mem_mhz"),
        "power_w_median": median("power_w"),
        "temperature_c_max": max(temperatures) if temperatures else None,
        "utilization_median": median("utilization"),
        "reasons": [name for name in reason_names(bits) if name != "gpu_idle"],
    }


def first_visible_gpu() -> str:
    """The GPU the benchmark's engines use: CUDA_VISIBLE_DEVICES' first entry (an index or a UUID), else 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"


class GpuClockSampler:
    """nvidia-smi in a loop while the benchmark runs; `between(start, end)` gives the samples in a time window."""

    def __init__(self, sample_ms: int = SAMPLE_MS) -> None:
        self.sample_ms = sample_ms
        self.samples: list[Sample] = []
        self._arrived = threading.Condition()  # guards samples; notified with each one read
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> bool:
        """Sampling from now on; False (and nothing sampled) without nvidia-smi or a query it accepts."""
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return False
        device = ["--id", first_visible_gpu()]
        for query in QUERIES:
            command = [smi, *device, f"--query-gpu={query}", "--format=csv,noheader,nounits"]
            try:  # the field names differ between drivers: the one this driver answers
                subprocess.run(command, capture_output=True, timeout=30, check=True)
            except (OSError, subprocess.SubprocessError):
                continue
            self._process = subprocess.Popen(
                [*command, f"--loop-ms={self.sample_ms}"],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            lines = self._process.stdout
            self._reader = threading.Thread(target=self._read, args=(lines,), name="gpu-clocks", daemon=True)
            self._reader.start()
            return True
        return False

    def _read(self, lines: Iterable[str]) -> None:
        for line in lines:  # until nvidia-smi ends (stop)
            sample = parse_line(line, time.time())
            if sample is not None:
                with self._arrived:
                    self.samples.append(sample)
                    self._arrived.notify_all()

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self._process = None

    def between(self, start: float, end: float) -> list[Sample]:
        """The samples stamped in [start, end]. While sampling, first waits (at most SETTLE_INTERVALS sample
        intervals, at least a second) for one stamped after `end`: a window that ends now would otherwise miss those
        taken inside it that nvidia-smi's pipe and the reader thread have not yet brought in (a short measurement's
        only ones, on a busy machine)."""
        deadline = time.monotonic() + max(1.0, SETTLE_INTERVALS * self.sample_ms / 1000)
        with self._arrived:
            while self._reading() and not (self.samples and self.samples[-1].at >= end):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(left)
            return [sample for sample in self.samples if start <= sample.at <= end]

    def _reading(self) -> bool:
        return self._reader is not None and self._reader.is_alive()


def describe(runs: Iterable[dict[str, Any]]) -> list[str]:
    """The report's lines: the SM clock over every measurement that has a summary, and the measurements whose
    median SM clock fell below SLOW_CLOCK of that median or that a slowdown (SLOWDOWNS) held down (at most
    MAX_LISTED, slowest first)."""
    measured = [run for run in runs if run.get("gpu_clocks")]
    medians = [run["gpu_clocks"]["sm_mhz_median"] for run in measured if run["gpu_clocks"]["sm_mhz_median"]]
    if not medians:
        return []
    typical = statistics.median(medians)
    lowest = min(run["gpu_clocks"]["sm_mhz_min"] for run in measured)
    lines = [
        f"GPU SM clock while measuring: median {typical:.0f} MHz over {len(measured)} measurements, lowest sample "
        f"{lowest:.0f} MHz"
    ]

    def slowed(clocks: dict[str, Any]) -> bool:
        return clocks["sm_mhz_median"] < SLOW_CLOCK * typical or bool(SLOWDOWNS.intersection(clocks["reasons"]))

    flagged = [run for run in measured if slowed(run["gpu_clocks"])]
    flagged.sort(key=lambda run: run["gpu_clocks"]["sm_mhz_median"])
    for run in flagged[:MAX_LISTED]:
        clocks = run["gpu_clocks"]
        reasons = ", ".join(clocks["reasons"]) or "no reason given"
        lines.append(
            f"  {run['path']} {run['max_tokens']} tokens x {run['concurrency']} rep {run['rep'] + 1}: SM median "
            f"{clocks['sm_mhz_median']:.0f} MHz (lowest {clocks['sm_mhz_min']:.0f}), {reasons}; "
            f"{run['output_tokens'] / run['wall']:.0f} tok/s"
        )
    if len(flagged) > MAX_LISTED:
        lines.append(f"  and {len(flagged) - MAX_LISTED} more")
    if not flagged:
        lines.append(f"  no measurement's clock below {SLOW_CLOCK:.0%} of that, none slowed by power or heat")
    return lines
