"""tools/measure_cpu_interference.py: the loop's rate with burners on the other CPUs over its rate with them off."""

from __future__ import annotations

import os
import statistics

import pytest

from tools.bench import busy_processes
from tools.measure_cpu_interference import Interference, _Work, loop_rate, main, measure, report


def test_loop_rate_counts_iterations_of_the_work():
    rate = loop_rate(_Work(), 0.05)
    assert rate > 100  # a step is microseconds of Python work


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a second CPU for the burner")
def test_a_burner_on_the_loop_s_own_cpu_takes_about_half_of_its_time():
    """The measurement sees interference where there is some (the other CPUs' own figures depend on the machine)."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        with busy_processes(1, "spin", [cpu]) as burner:
            burner.run(False)
            result = measure("own cpu", burner, _Work(), window=0.3, repeats=3, settle=0.02)
    finally:
        os.sched_setaffinity(0, before)
    assert len(result.ratios) == 3 and len(result.idle_rates) == 6
    assert 0.2 < statistics.median(result.ratios) < 0.8, result.ratios


def test_report_lists_each_burner_set_with_its_median_and_repeats():
    results = [
        Interference("cpu 1 (spin)", [0.7, 0.8, 0.75], idle_rates=[100.0, 90.0, 110.0, 100.0]),
        Interference("all 1 (memory)", [1.0, 0.98, 1.01], idle_rates=[80.0, 120.0]),
    ]
    lines = report(0, results).splitlines()
    assert lines[0].startswith("cpu 0: thread_siblings_list=")
    assert lines[2].split() == ["cpu", "1", "(spin)", "0.750", "0.700", "0.800", "0.750"]
    assert lines[3].split()[3] == "1.000"
    # every burners-off window of every set, over their median (100): the CPU's own noise
    assert lines[4].startswith("the loop alone (6 windows, burners off)")
    assert "lowest 0.800, highest 1.200" in lines[4]


def test_unknown_kind_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--kinds", "spin,cache"])
    assert "unknown ['cache']" in capsys.readouterr().err
