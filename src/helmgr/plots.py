"""PNG plots (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from helmgr.workload.stats import HOT_SET, TURNOVER_WINDOW_S, StreamSeries  # noqa: E402


def plot_workload(series: StreamSeries, title: str, path: Path, bursts=()) -> None:
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    t = np.arange(len(series.rps_1s))
    a.step(t, series.rps_1s, where="post", lw=1.0)
    for burst in bursts:
        a.axvspan(burst.start, burst.end, color="tab:red", alpha=0.15, lw=0)
    a.set_ylabel("requests / s")
    a.set_title(title)
    a.grid(alpha=0.3)
    b.plot(series.turnover_t, series.turnover * 60.0 / TURNOVER_WINDOW_S, marker="o", ms=3)
    b.set_ylabel(f"top-{HOT_SET} turnover / min")
    b.set_xlabel("time (s)")
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
