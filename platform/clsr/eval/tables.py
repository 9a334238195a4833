"""Score tables in the papers' layout (NumPy only: imported by joblib workers that have no torch)."""

from __future__ import annotations

import numpy as np


def paper_table(values_by_name: dict[str, float]) -> str:
    """Names as columns, one row of values, and their mean as ``Avg.`` when there are several."""
    names, values = list(values_by_name), list(values_by_name.values())
    if len(values) > 1:
        names.append("Avg.")
        values.append(float(np.mean(values)))
    widths = [max(len(n), 6) for n in names]
    header = " | ".join(n.rjust(w) for n, w in zip(names, widths, strict=True))
    row = " | ".join(f"{v:.2f}".rjust(w) for v, w in zip(values, widths, strict=True))
    return f"{header}\n{'-' * len(header)}\n{row}"
