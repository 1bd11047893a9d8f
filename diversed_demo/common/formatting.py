"""The one number formatter of the reports: the command line's summary, the bench's tables and the app."""

from __future__ import annotations

import math


def fmt(value: float | None, spec: str = ".3f", missing: str = "n/a") -> str:
    """`value` as format(value, spec) takes it (".2f", "+.1%", …), or `missing` where there is no value
    (the acceptance rate of a run that drafted nothing, a mode a category did not run, a NaN from pandas)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)
