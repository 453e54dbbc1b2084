"""Means of counted figures, for the engine's step and lag statistics (core/step_stats.py, core/engine_lags.py):
an interval in which nothing was counted has a mean of 0, not an error."""

from __future__ import annotations

from collections.abc import Iterable


def mean(total: float, count: int) -> float:
    return total / count if count else 0.0


def weighted_mean(means: Iterable[tuple[float, int]]) -> float:
    """Several intervals' means as one: each (mean, count) weighted by its count."""
    total, count = 0.0, 0
    for value, weight in means:
        total += value * weight
        count += weight
    return mean(total, count)
