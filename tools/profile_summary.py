"""Summarise py-spy's raw (collapsed-stack) profiles, as `tools/bench.py --profile` writes them, into a short text.

    python tools/profile_summary.py OUT/profiles [--top 15] [--match EngineCore]

For each profile file: its active samples (py-spy leaves idle threads out, so at `--rate 200` a sample is ~5 ms of
a thread on a CPU), the share per thread, and the functions with the most samples, by self time (the frame on top)
and by inclusive time (anywhere in the stack). Raw profiles of a level are tens of MB; this is what is worth
keeping of them.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LOCATION = re.compile(r" \((.*?):\d+\)$")  # "function (file.py:123)" -> group(1) is the file


def _frame(frame: str) -> str:
    """A frame without its line number: 'function (file.py)' (file shortened to its last two parts)."""
    match = _LOCATION.search(frame)
    if match is None:
        return frame
    short = "/".join(Path(match.group(1)).parts[-2:])
    return f"{frame[: match.start()]} ({short})"


def summarise(path: Path, top: int) -> str:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "thread ?")
        code = [_frame(f) for f in frames if not f.startswith(("process ", "thread "))]
        total += count
        threads[thread] += count
        if code:
            self_time[code[-1]] += count
        for frame in set(code):
            inclusive[frame] += count
    if total == 0:
        return f"== {path.name}: no samples\n"
    lines = [f"== {path.name}: {total} samples"]
    lines.append("  threads: " + ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in threads.most_common(6)))
    for title, counter in (("self", self_time), ("inclusive", inclusive)):
        lines.append(f"  top {title}:")
        lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--match", default="", help="only files whose name contains this")
    args = parser.parse_args()
    for path in sorted(args.folder.glob("*.txt")):
        if args.match in path.name:
            print(summarise(path, args.top))


if __name__ == "__main__":
    main()
