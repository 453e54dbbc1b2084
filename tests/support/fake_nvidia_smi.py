"""A stand-in for nvidia-smi on PATH (the CPU machine has none): it answers only tools/gpu_clocks.py's query, with
fixed readings, once or every 20 ms with --loop-ms, and fails every other command, as a driver without a field
would. The benchmark's GPU clock sampling is then exercised end to end with a real subprocess."""

from __future__ import annotations

import os
import stat
from pathlib import Path

SM_MHZ = 1980
READING = f"{SM_MHZ}, 2619, 312.5, 41, 87, 0x0000000000000001"  # clocks, power, temperature, utilization; idle

SCRIPT = f"""#!/bin/sh
case "$*" in
  *--query-gpu=timestamp,clocks.sm,*{{REJECT}}*) exit 2 ;;
  *--query-gpu=timestamp,clocks.sm,*) ;;
  *) exit 1 ;;
esac
case "$*" in
  *--loop-ms*) while :; do echo "$(date '+%Y/%m/%d %H:%M:%S.%3N'), {READING}"; sleep 0.02; done ;;
esac
echo "$(date '+%Y/%m/%d %H:%M:%S.%3N'), {READING}"
"""


def install(folder: Path, reject: str = "no-such-field") -> str:
    """nvidia-smi in `folder`, refusing queries that name `reject`; returns a PATH with `folder` first."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(SCRIPT.replace("{REJECT}", reject), encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
