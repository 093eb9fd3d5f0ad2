"""The evaluation's plots: P99 by configuration, capacity at SLO, each router's P99 against the
static split, and the controller's ratio against the phase oracle's r* and band."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_p99(table: list[dict], regimes, slo_ms: float | None, path: Path) -> None:
    """Per regime, each configuration's P99: the mean over seeds, whiskers from the lowest to the
    highest seed; hatched where some seed was overloaded."""
    configs = list(dict.fromkeys(f"{r['policy']}@{r['router']}" for r in table))
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.2 * len(regimes), 4.2), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for k, c in enumerate(configs):
            got = [r for r in table if r["regime"] == regime and f"{r['policy']}@{r['router']}" == c]
            v = np.array([r["p99_ms"] for r in got], float)
            if not len(v):
                continue
            over = any(r["overloaded"] for r in got)
            ax.bar(k, v.mean(), color=f"C{k % 10}", hatch="//" if over else None,
                   yerr=[[v.mean() - v.min()], [v.max() - v.mean()]], capsize=3)
        if slo_ms:
            ax.axhline(slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
            ax.legend(fontsize=8)
        ax.set_xticks(range(len(configs)), configs, rotation=60, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_title(regime)
        ax.set_ylabel("P99 (ms)")
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_capacity(caps: list[dict], regimes, path: Path) -> None:
    """Per regime, each capacity pair's capacity at SLO (the lowest seed's) in req/s."""
    configs = list(dict.fromkeys(c["config"] for c in caps))
    fig, ax = plt.subplots(figsize=(1.6 + 1.8 * len(regimes), 4))
    width = 0.8 / max(1, len(configs))
    for k, c in enumerate(configs):
        v = [next((x["capacity_rps"] or 0.0 for x in caps if x["regime"] == g and x["config"] == c), 0.0)
             for g in regimes]
        ax.bar(np.arange(len(regimes)) + k * width, v, width, label=c)
    ax.set_xticks(np.arange(len(regimes)) + 0.4 - width / 2, regimes)
    ax.set_ylabel("capacity at SLO (req/s)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_routers(rows: list[dict], regimes, routers, slo_ms: float | None, path: Path) -> None:
    """Per regime, each sweep router's P99 (the mean of the seeds) against the static split."""
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.2 * len(regimes), 3.8), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        got = [r for r in rows if r["regime"] == regime]
        for k, rt in enumerate(routers):
            ax.plot([r["ratio"] for r in got], [r[rt] for r in got], "o-", ms=3, color=f"C{k % 10}", label=rt)
        if slo_ms:
            ax.axhline(slo_ms, color="tab:red", ls="--", lw=1, label=f"SLO {slo_ms:g} ms")
        ax.set_yscale("log")
        ax.set_title(regime)
        ax.set_xlabel("static EMB ratio")
        ax.set_ylabel("P99 (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratios(traces: dict, path: Path) -> None:
    """Per regime (one seed): each run's mean ratio per window, the oracle's r* and its band."""
    fig, axes = plt.subplots(len(traces), 1, figsize=(9, 2.6 * len(traces)), squeeze=False, sharex=True)
    for ax, (regime, (oracle, runs)) in zip(axes[:, 0], traces.items()):
        t = np.arange(len(oracle["r_star"]))
        ax.fill_between(t, oracle["band_lo"], oracle["band_hi"], step="mid", alpha=0.25, color="grey",
                        label="oracle band")
        ax.step(t, oracle["r_star"], where="mid", color="k", lw=1, label="oracle r*")
        for label, ratio in runs.items():
            ax.plot(np.arange(len(ratio)), ratio, lw=1, label=label)
        ax.set_ylabel(f"{regime}: EMB ratio")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_plan(result: dict, path: Path) -> None:
    """Capacity at SLO against nodes: each candidate's probe point and its linear scaling, the
    chosen size's measured capacity, the target rate."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    chosen = result["plan"]
    top = max([r["nodes"] or 0 for r in result["candidates"]] + [chosen["nodes"] if chosen else 0]) + 2
    for k, r in enumerate(result["candidates"]):
        if not r["capacity_rps"]:
            continue
        n = np.arange(0, top + 1)
        label = f"{r['policy']}@{r['router']}"
        ax.plot(n, n * r["per_node_rps"], color=f"C{k}", ls=":", lw=1)
        ax.plot([r["probe_nodes"]], [r["capacity_rps"]], "o", color=f"C{k}", label=f"{label} (measured)")
    if chosen and chosen.get("capacity_measured") and chosen["capacity_rps"]:
        ax.plot([chosen["nodes"]], [chosen["capacity_rps"]], "*", ms=12, color="k",
                label=f"plan: {chosen['nodes']} nodes, {chosen['policy']}@{chosen['router']}")
    elif chosen:
        ax.axvline(chosen["nodes"], color="k", lw=1, label=f"plan: {chosen['nodes']} nodes")
    ax.axhline(result["target_rps"], color="tab:red", ls="--", lw=1, label=f"target {result['target_rps']:g} req/s")
    ax.set_xlabel("nodes")
    ax.set_ylabel("capacity at SLO (req/s)")
    ax.set_xlim(0, top)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
