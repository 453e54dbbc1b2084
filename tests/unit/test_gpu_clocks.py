"""tools/gpu_clocks.py: nvidia-smi's lines read, a measurement's samples summed up, the sampler run as a real
subprocess (a stand-in nvidia-smi: this machine has no GPU), and the report's lines."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.support import fake_nvidia_smi
from tools.gpu_clocks import TIMESTAMP_FORMAT, GpuClockSampler, Sample, describe, parse_line, reason_names, summarize


def test_a_line_of_nvidia_smi_is_read_with_its_own_timestamp():
    sample = parse_line("2026/11/29 04:30:00.250, 1980, 2619, 312.50, 41, 87, 0x0000000000000004", arrived=1.0)
    assert sample == Sample(datetime(2026, 11, 29, 4, 30, 0, 250000).timestamp(), 1980, 2619, 312.5, 41, 87, 4)
    # a timestamp that does not parse: the time the line arrived; fields a GPU does not report: None
    sample = parse_line("later, 1410, [N/A], [Not Supported], 40, 0, 0x0", arrived=7.5)
    assert sample == Sample(7.5, 1410, None, None, 40, 0, 0)
    # anything else (nvidia-smi's messages, a header, a line without the SM clock) is no sample
    for line in ("No devices were found", "timestamp, clocks.current.sm [MHz]", "t, [N/A], 1, 1, 1, 1, 0x0", ""):
        assert parse_line(line, arrived=0.0) is None


def test_reasons_are_named_by_nvmls_bits():
    assert reason_names(0x0) == []
    assert reason_names(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap", "hw_thermal_slowdown"]
    assert reason_names(0x400) == ["0x400"]  # a bit newer than this list: kept, by number


def test_a_measurements_samples_in_a_few_numbers():
    samples = [
        Sample(0.0, 1980, 2619, 300.0, 40, 90, 0x1),
        Sample(0.2, 1200, 2619, 700.0, 44, 100, 0x4),
        Sample(0.4, 1900, 2600, None, 42, 95, 0x0),
    ]
    assert summarize(samples) == {
        "samples": 3,
        "sm_mhz_median": 1900,
        "sm_mhz_min": 1200,
        "mem_mhz_min": 2600,
        "power_w_median": 500.0,  # of the two readings there are
        "temperature_c_max": 44,
        "utilization_median": 95,
        "reasons": ["sw_power_cap"],  # idleness is no slowdown: left out
    }
    assert summarize([]) is None


def _run(path: str, rep: int, sm_min: float, sm_median: float, reasons: list[str], tokens: int = 1000) -> dict:
    clocks = {"sm_mhz_min": sm_min, "sm_mhz_median": sm_median, "reasons": reasons}
    return {"path": path, "max_tokens": 64, "concurrency": 64, "rep": rep, "output_tokens": tokens, "wall": 2.0,
            "gpu_clocks": clocks}  # fmt: skip


def test_the_report_lists_the_measurements_whose_clock_fell_or_was_held_down():
    runs = [
        _run("bare", 0, 1970, 1980, []),
        _run("plain-grpc", 0, 1960, 1980, []),
        _run("bare", 1, 900, 1500, [], tokens=300),  # a slow spell
        _run("bare-stream", 1, 345, 1975, []),  # one sample idle between two waves: no spell
        _run("plain-grpc", 1, 1950, 1980, ["sw_power_cap"]),  # held down, if only a little
        _run("stream-grpc", 0, 1975, 1980, ["applications_clocks_setting"]),  # a setting, not a slowdown
        {"path": "vllm-serve", "max_tokens": 64, "concurrency": 64, "rep": 0, "gpu_clocks": None},  # not sampled
    ]
    lines = describe(runs)
    assert lines[0] == "GPU SM clock while measuring: median 1980 MHz over 6 measurements, lowest sample 345 MHz"
    assert lines[1:] == [
        "  bare 64 tokens x 64 rep 2: SM median 1500 MHz (lowest 900), no reason given; 150 tok/s",
        "  plain-grpc 64 tokens x 64 rep 2: SM median 1980 MHz (lowest 1950), sw_power_cap; 500 tok/s",
    ]
    steady = describe([_run("bare", 0, 1970, 1980, []), _run("bare", 1, 1965, 1980, [])])
    assert steady[1] == "  no measurement's clock below 90% of that, none slowed by power or heat"
    assert describe([{"path": "bare", "gpu_clocks": None}]) == []  # results of a machine without nvidia-smi


def _first_sample(sampler: GpuClockSampler, deadline_s: float = 10.0) -> bool:
    end = time.monotonic() + deadline_s
    while not sampler.samples and time.monotonic() < end:
        time.sleep(0.01)
    return bool(sampler.samples)


def test_the_sampler_reads_nvidia_smi_in_a_loop_and_gives_a_windows_samples(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi.install(tmp_path / "bin"))
    sampler = GpuClockSampler(sample_ms=20)
    assert sampler.start()
    try:
        assert _first_sample(sampler)  # the stand-in has started (a Python process: slow to start on a busy machine)
        start = time.time()
        time.sleep(0.5)
        end = time.time()
        inside = sampler.between(start, end)  # waits for the window's last samples
    finally:
        sampler.stop()
    assert 5 <= len(inside) < len(sampler.samples)  # every ~20 ms, each by its own timestamp
    assert all(start <= sample.at <= end for sample in inside)
    assert {sample.sm_mhz for sample in inside} == {fake_nvidia_smi.SM_MHZ}
    assert summarize(inside)["reasons"] == []
    count = len(sampler.samples)
    time.sleep(0.1)
    assert len(sampler.samples) == count  # stopped: nothing more comes


def _line(at: float) -> str:
    return datetime.fromtimestamp(at).strftime(TIMESTAMP_FORMAT)[:-3] + ", " + fake_nvidia_smi.READING + "\n"


def _reading(sampler: GpuClockSampler, lines: Iterator[str]) -> threading.Thread:
    """The sampler's reader thread over `lines` in place of nvidia-smi's pipe."""
    sampler._reader = threading.Thread(target=sampler._read, args=(lines,), daemon=True)
    sampler._reader.start()
    return sampler._reader


def test_a_window_that_just_ended_waits_for_the_samples_taken_inside_it():
    # nvidia-smi took a sample inside the window, but its line comes through after the window is asked for (the
    # pipe, a busy reader): it counts, and the asking returns once a sample stamped after the window is in
    start = time.time()
    end = start + 0.05

    def late_lines() -> Iterator[str]:
        time.sleep(0.3)
        yield _line(start + 0.02)
        yield _line(end + 0.01)
        time.sleep(5)  # nvidia-smi still running

    sampler = GpuClockSampler(sample_ms=1000)  # its bound: 3 s (SETTLE_INTERVALS intervals)
    _reading(sampler, late_lines())
    asked = time.monotonic()
    inside = sampler.between(start, end)
    waited = time.monotonic() - asked
    assert [sample.at for sample in inside] == [pytest.approx(start + 0.02, abs=0.001)]
    assert 0.25 <= waited < 2.5  # until the sample after the window, not the whole bound


def test_a_silent_nvidia_smi_holds_a_window_back_at_most_its_bound():
    def silent() -> Iterator[str]:
        time.sleep(3)
        yield from ()

    sampler = GpuClockSampler(sample_ms=20)  # the bound: a second (SETTLE_INTERVALS intervals, at least a second)
    _reading(sampler, silent())
    asked = time.monotonic()
    assert sampler.between(0.0, time.time()) == []
    assert 0.9 <= time.monotonic() - asked < 2.5


@pytest.mark.parametrize("reject", ["clocks_event_reasons", "clocks."])
def test_a_driver_that_refuses_a_query(tmp_path: Path, monkeypatch, reject: str):
    # an older driver knows the reasons as clocks_throttle_reasons: the second query; one that refuses both: none
    monkeypatch.setenv("PATH", fake_nvidia_smi.install(tmp_path / "bin", reject=reject))
    sampler = GpuClockSampler(sample_ms=20)
    started = sampler.start()
    if started:
        _first_sample(sampler)
    else:
        time.sleep(0.2)  # a refused query: nothing would come
    sampler.stop()
    assert started == (reject == "clocks_event_reasons")
    assert bool(sampler.samples) == started


def test_no_nvidia_smi_no_samples(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: the CPU machine's case
    sampler = GpuClockSampler()
    assert not sampler.start()
    sampler.stop()
    assert sampler.between(0.0, time.time()) == []
