"""A stand-in for nvidia-smi on PATH (the CPU machine has none): it answers only tools/gpu_clocks.py's query, with
fixed readings, once or every 20 ms with --loop-ms, and fails every other command, as a driver without a field
would. The benchmark's GPU clock sampling is then exercised end to end with a real subprocess: one Python process,
so that a loaded machine delays its samples no more than it would nvidia-smi's (a shell loop forks twice a sample).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

SM_MHZ = 1980
READING = f"{SM_MHZ}, 2619, 312.5, 41, 87, 0x0000000000000001"  # clocks, power, temperature, utilization; idle

SCRIPT = f"""#!{sys.executable} -S
import sys, time
from datetime import datetime

arguments = " ".join(sys.argv[1:])
if "--query-gpu=timestamp,clocks.sm," not in arguments:
    sys.exit(1)
if "{{REJECT}}" in arguments.split("--query-gpu=", 1)[1].split()[0]:
    sys.exit(2)

def reading():
    stamp = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # nvidia-smi's: milliseconds, local time
    print(f"{{stamp}}, {READING}", flush=True)

reading()
while "--loop-ms" in arguments:
    time.sleep(0.02)
    reading()
"""


def install(folder: Path, reject: str = "no-such-field") -> str:
    """nvidia-smi in `folder`, refusing queries that name `reject`; returns a PATH with `folder` first."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(SCRIPT.replace("{REJECT}", reject), encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
