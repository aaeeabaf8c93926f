"""A table of interleaved measurements against one of them (the peer measured in the same run)."""

from __future__ import annotations

import statistics


def medians_against(samples: dict[str, list[float]], base: str, *, unit: str, prefix: str = "") -> tuple[dict, dict]:
    """Print and return each case's median, and how many times faster than `base`'s it is."""
    medians = {name: round(statistics.median(values), 4) for name, values in samples.items()}
    speedup = {name: round(medians[base] / value, 2) for name, value in medians.items()}
    for name, value in medians.items():
        print(f"{prefix}{name:40s} {value:8.3f} {unit}  x{speedup[name]:.2f}")
    return medians, speedup
