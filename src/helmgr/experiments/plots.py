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
    _shade_bursts(a, bursts)
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


def plot_class_windows(windows: dict, bursts, title: str, out: Path) -> list[str]:
    """Each class's P99 per window against its own target (dashed, same colour)."""
    names = []
    fig, ax = plt.subplots(figsize=(9, 4))
    for k, (name, (starts, p99, slo_ms)) in enumerate(windows.items()):
        colour = f"C{k % 10}"
        ax.plot(starts, p99, marker=".", lw=1, color=colour, label=f"{name} (target {slo_ms:g} ms)")
        ax.axhline(slo_ms, color=colour, ls="--", lw=1)
    _shade_bursts(ax, bursts)
    ax.set_yscale("log")
    _decorate(ax, "time (s)", "window P99 (ms)", title)
    _save(fig, out / "p99_windows_by_class.png", names)
    return names


def plot_simulation(series, title: str, out: Path) -> list[str]:
    """Latency CDF, P99 per window, ratio timeline per node, hit rates per window."""
    names = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lat = np.sort(series.latency_ms)
    if len(lat):
        ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat))
    ax.axvline(series.slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {series.slo_ms:g} ms")
    ax.set_xscale("log")
    _decorate(ax, "latency (ms)", "CDF", title)
    _save(fig, out / "latency_cdf.png", names)

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(series.window_start, series.window_p99_ms, marker=".", lw=1)
    ax.axhline(series.slo_ms, color="tab:red", ls="--", lw=1, label="SLO")
    _shade_bursts(ax, series.bursts)
    ax.set_yscale("log")
    _decorate(ax, "time (s)", "window P99 (ms)", title)
    _save(fig, out / "p99_windows.png", names)

    fig, ax = plt.subplots(figsize=(9, 4))
    end = series.window_start[-1] + (series.window_start[1] - series.window_start[0] if len(series.window_start) > 1 else 1)
    for node in range(series.n_nodes):
        pts = [(t, r) for t, n, r in series.timeline if n == node]
        if pts:
            t = [p[0] for p in pts] + [end]
            r = [p[1] if p[1] is not None else np.nan for p in pts]
            ax.step(t, r + [r[-1]], where="post", lw=1, label=f"node {node}" if series.n_nodes <= 8 else None)
    _shade_bursts(ax, series.bursts)
    ax.set_ylim(0, 1)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("EMB ratio r")
    ax.set_title(title)
    if series.n_nodes <= 8:
        ax.legend(ncol=4, fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, out / "ratio_timeline.png", names)

    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(series.window_start, series.window_emb_hit, label="EMB hit rate")
    ax.plot(series.window_start, series.window_kv_hit, label="KV hit rate (tokens)")
    _shade_bursts(ax, series.bursts)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    _save(fig, out / "hit_rates.png", names)
    return names


def plot_showcase(runs: dict, title: str, path: Path) -> None:
    """label -> Series: each run's window P99 (SLO dashed) above its EMB ratio per window (the
    mean over nodes)."""
    from helmgr.sim.metrics import window_ratios
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    first = next(iter(runs.values()))
    for (label, s), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
        a.plot(s.window_start, s.window_p99_ms, lw=1, color=color, label=label)
        step = s.window_start[1] - s.window_start[0] if len(s.window_start) > 1 else 1.0
        r = window_ratios(s.timeline, s.n_nodes, len(s.window_start) * step, step)
        b.step(s.window_start, r, where="post", lw=1.2, color=color, label=label)
    a.axhline(first.slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {first.slo_ms:g} ms")
    for ax in (a, b):
        _shade_bursts(ax, first.bursts)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    a.set_yscale("log")
    a.set_ylabel("window P99 (ms)")
    a.set_title(title)
    b.set_ylim(0, 1)
    b.set_ylabel("EMB ratio r (mean of nodes)")
    b.set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sweep(rows: list[dict], title: str, path: Path) -> None:
    """P99 and SLO attainment against the static ratio."""
    r = [x["ratio"] for x in rows]
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    a.plot(r, [x["p99_ms"] for x in rows], marker="o")
    a.axhline(rows[0]["slo_ms"], color="tab:red", ls="--", lw=1, label="SLO")
    best = min(rows, key=lambda x: x["p99_ms"])
    a.axvline(best["ratio"], color="tab:green", ls=":", label=f"best r = {best['ratio']:.2f}")
    a.set_yscale("log")
    a.set_ylabel("P99 (ms)")
    a.set_title(title)
    a.legend()
    a.grid(alpha=0.3, which="both")
    b.plot(r, [x["slo_attainment"] for x in rows], marker="o", label="requests within SLO")
    b.plot(r, [x["window_slo_satisfaction"] for x in rows], marker="s", label="windows with P99 within SLO")
    b.set_ylim(0, 1.02)
    b.set_xlabel("EMB ratio r (static)")
    b.set_ylabel("share")
    b.legend()
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _decorate(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3, which="both")


def _shade_bursts(ax, bursts) -> None:
    for b in bursts:
        ax.axvspan(b.start, b.end, color="tab:red", alpha=0.12, lw=0)


def _save(fig, path: Path, names: list[str]) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    names.append(path.name)


def draw_oracle(ax, r_star, band=None) -> None:
    """On a plot of the mean ratio per 1-s window: the phase oracle's r* per window (None: none)
    and, given as (low, high) per window, its band shaded; the plot's axes."""
    if band is not None:
        ax.fill_between(np.arange(len(band[0])), band[0], band[1], step="post", color="0.85",
                        label="oracle band (within 2 %)")
    if r_star is not None:
        ax.step(np.arange(len(r_star)), r_star, where="post", color="k", lw=1.5, label="oracle r*")
    ax.set_ylim(0, 1)
    ax.set_xlabel("window (s)")
    ax.set_ylabel("mean EMB ratio")
    ax.grid(alpha=0.3)


def plot_compare(rows: list[dict], timelines: dict, r_star, title: str, out: Path) -> None:
    """Bars of P99 and window SLO satisfaction per policy; ratio per window against r*; CDFs."""
    from helmgr.sim.metrics import window_ratios
    labels = [f"{r['policy']}\n{r['router']}" if len({x['router'] for x in rows}) > 1 else r["policy"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    a.bar(labels, [r["p99_ms"] for r in rows], color="tab:blue")
    a.axhline(rows[0]["slo_ms"], color="tab:red", ls="--", lw=1, label="SLO")
    a.set_yscale("log")
    a.set_ylabel("P99 (ms)")
    a.legend()
    b.bar(labels, [r["window_slo_satisfaction"] for r in rows], color="tab:green")
    b.set_ylim(0, 1.02)
    b.set_ylabel("window SLO satisfaction")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "compare_p99_slo.png", dpi=110)
    plt.close(fig)

    names = [x.replace("\n", " · ") for x in labels]
    fig, ax = plt.subplots(figsize=(10, 4))
    for r, name in zip(rows, names):
        series = timelines.get((r["policy"], r["router"]))
        if series is None:
            ax.axhline(r["ratio"], lw=1, ls=":", label=f"{name} ({r['ratio']:g})")
        elif r["policy"] != "oracle":
            ax.plot(window_ratios(series.timeline, series.n_nodes, r["duration_s"]), lw=1, label=name)
    draw_oracle(ax, r_star)
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(out / "compare_ratios.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r, name in zip(rows, names):
        series = timelines.get((r["policy"], r["router"]))
        if series is not None and len(series.latency_ms):
            lat = np.sort(series.latency_ms)
            ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), lw=1, label=name)
    ax.axvline(rows[0]["slo_ms"], color="tab:red", ls="--", lw=1, label=f"SLO {rows[0]['slo_ms']:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("CDF")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "compare_cdf.png", dpi=110)
    plt.close(fig)


def plot_router_p99(p99: dict, title: str, path: Path) -> None:
    """Grouped bars: P99 (log scale) per router for each workload; `p99[workload][router]` is a
    list over seeds (bar = mean, dots = seeds)."""
    workloads = list(p99)
    routers = list(dict.fromkeys(r for w in workloads for r in p99[w]))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(routers)
    for k, r in enumerate(routers):
        x = np.arange(len(workloads)) + (k - (len(routers) - 1) / 2) * width
        vals = [p99[w].get(r, []) for w in workloads]
        ax.bar(x, [np.mean(v) if v else np.nan for v in vals], width, label=r)
        for xi, v in zip(x, vals):
            ax.plot([xi] * len(v), v, "k.", ms=3)
    ax.set_xticks(np.arange(len(workloads)), workloads)
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=4)
    _decorate(ax, "workload", "P99 latency (ms)", title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scenario(result: dict, out: Path) -> list[str]:
    """Per regime: P99 against the static ratio for the whole run and for each phase kind (one line
    per seed), the SLO, and the stress phases' violation share at the base's best split (S4)."""
    pngs = []
    for regime, r in result["regimes"].items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = {}
        for seed, props in r["seeds"].items():
            x = props["ratios"]
            lines = {"whole run": props["p99_ms"]} | props.get("p99_ms_by_kind", {})
            first = seed == next(iter(r["seeds"]))
            for label, y in lines.items():
                c = colors.setdefault(label, f"C{len(colors)}")
                ax.plot(x, y, marker="o", ms=3, color=c, alpha=0.8, label=label if first else None)
        if result.get("slo_ms"):
            ax.axhline(result["slo_ms"], color="tab:red", ls="--", lw=1, label="SLO")
        s4 = r["summary"].get("S4")
        note = "" if s4 is None else ("; stress phases violated at the base's best split: "
                                      + ", ".join("-" if v is None else f"{v:.0%}" for v in s4["values"].values()))
        ax.set_yscale("log")
        _decorate(ax, "EMB ratio r (static)", "P99 (ms)", f"{regime}: P99 by phase kind{note}")
        ax.title.set_fontsize(9)
        name = f"scenario-{regime}.png"
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        pngs.append(name)
    return pngs
