"""Summarise py-spy's raw (collapsed-stack) profiles, as `tools/bench.py --profile` writes them, into a short text.

    python tools/profile_summary.py OUT/profiles [--top 15] [--match EngineCore]
    python tools/profile_summary.py --compare BEFORE.txt AFTER.txt [--thread MainThread]

For each profile file: its active samples (py-spy leaves idle threads out, so at `--rate 200` a sample is ~5 ms of
a thread on a CPU), the share per thread, and the functions with the most samples, by self time (the frame on top)
and by inclusive time (anywhere in the stack). Raw profiles of a level are tens of MB; this is what is worth
keeping of them.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_LOCATION = re.compile(r" \((.*?):\d+\)$")  # "function (file.py:123)" -> group(1) is the file


def _frame(frame: str) -> str:
    """A frame without its line number: 'function (file.py)' (file shortened to its last two parts)."""
    match = _LOCATION.search(frame)
    if match is None:
        return frame
    short = "/".join(Path(match.group(1)).parts[-2:])
    return f"{frame[: match.start()]} ({short})"


@dataclass
class Profile:
    """One raw profile's samples: in all, per thread, per function on top of the stack (self) and anywhere in it."""

    total: int = 0
    threads: Counter[str] = field(default_factory=Counter)
    self_time: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)


def read_profile(path: Path, thread_filter: str = "") -> Profile:
    """py-spy's raw collapsed stacks, summed; `thread_filter`: only stacks of threads whose name contains it."""
    profile = Profile()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread ")), "thread ?")
        if thread_filter not in thread:
            continue
        code = [_frame(f) for f in frames if not f.startswith(("process ", "thread "))]
        profile.total += count
        profile.threads[thread] += count
        if code:
            profile.self_time[code[-1]] += count
        for frame in set(code):
            profile.inclusive[frame] += count
    return profile


def summarise(path: Path, top: int) -> str:
    profile = read_profile(path)
    total = profile.total
    if total == 0:
        return f"== {path.name}: no samples\n"
    lines = [f"== {path.name}: {total} samples"]
    lines.append("  threads: " + ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in profile.threads.most_common(6)))
    for title, counter in (("self", profile.self_time), ("inclusive", profile.inclusive)):
        lines.append(f"  top {title}:")
        lines += [f"    {100 * n / total:5.1f}%  {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines) + "\n"


def compare(before: Path, after: Path, top: int, thread_filter: str = "") -> str:
    """Where `after` has more samples than `before` (the same process in two runs of equal length, e.g. the bare
    engine's EngineCore and ours): the functions whose samples grew most, self and inclusive, in samples."""
    a, b = read_profile(before, thread_filter), read_profile(after, thread_filter)
    lines = [f"== {after.name} ({b.total} samples) against {before.name} ({a.total} samples)"]
    if thread_filter:
        lines[0] += f", threads matching {thread_filter!r}"
    for title, old, new in (("self", a.self_time, b.self_time), ("inclusive", a.inclusive, b.inclusive)):
        growth = Counter({frame: new[frame] - old[frame] for frame in set(old) | set(new)})
        lines.append(f"  most grown, {title} (samples: more, before, after):")
        lines += [f"    {n:+6d} {old[frame]:6d} {new[frame]:6d}  {frame}" for frame, n in growth.most_common(top)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--match", default="", help="only files whose name contains this")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="two profiles' difference")
    parser.add_argument("--thread", default="", help="with --compare: only threads whose name contains this")
    args = parser.parse_args()
    if args.compare:
        print(compare(*args.compare, args.top, args.thread))
        return
    if args.folder is None:
        parser.error("a folder of profiles, or --compare BEFORE AFTER")
    for path in sorted(args.folder.glob("*.txt")):
        if args.match in path.name:
            print(summarise(path, args.top))


if __name__ == "__main__":
    main()
