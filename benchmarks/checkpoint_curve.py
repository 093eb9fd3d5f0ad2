"""How a base policy's validation score moves with its training budget (issue 22).

    python benchmarks/checkpoint_curve.py RUN_DIR [--final policy.npz] --validate-seeds 101,102

`RUN_DIR` is one training run's folder holding `checkpoint-<transitions>.npz` files (`helmgr
train --checkpoint-every N`). Each checkpoint, the finished policy (`--final`) and the shipped one
are validated as `helmgr train --seeds` validates its candidates (`experiments.training.validate`:
the base alone, `helm-base`, on the v2 cluster, each regime and validation seed). Printed, a line
a policy: transitions, episodes (transitions over nodes times control seconds an episode), the
geometric-mean validation P99 and, per regime, the mean P99 and mean ratio. Written to `--out`:
`curve.json` and `curve.png` (geo-mean P99 against episodes, the shipped policy's as a line
unless `--no-shipped`).
Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import numpy as np

from helmgr.controller.controller import default_policy_file
from helmgr.controller.mlp import MLPPolicy
from helmgr.experiments.training import SelectConfig, validate


def episodes(policy: MLPPolicy, transitions: int) -> float:
    env = policy.meta.get("env", {})
    return transitions / (env.get("nodes", 1) * env.get("episode_s", 120.0))


def per_regime(runs: list[dict]) -> dict:
    out = {}
    for r in runs:
        out.setdefault(r["regime"], []).append(r)
    return {k: {"p99_ms": float(np.mean([r["p99_ms"] for r in v])), "ratio": float(np.mean([r["mean_ratio"] for r in v]))}
            for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--final", type=Path, default=None, help="the finished policy of that run")
    ap.add_argument("--validate-seeds", default="101,102")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-shipped", action="store_true", help="leave the shipped policy out")
    ap.add_argument("--out", type=Path, default=Path("results/checkpoint_curve"))
    a = ap.parse_args()
    found = sorted(a.run.glob("checkpoint-*.npz"), key=lambda p: int(re.findall(r"\d+", p.stem)[-1]))
    paths = [str(p) for p in found] + ([str(a.final)] if a.final else [])
    if not paths:
        raise SystemExit(f"no checkpoint-*.npz in {a.run} and no --final")
    shipped = str(default_policy_file())
    every = paths + ([] if a.no_shipped else [shipped])
    sc = SelectConfig(seeds=(), timesteps=0, validate_seeds=tuple(int(s) for s in a.validate_seeds.split(",")))
    scored = validate(every, sc, a.jobs)
    rows = []
    for path, s in zip(every, scored):
        pol = MLPPolicy.load(path)
        n = pol.meta.get("checkpoint", pol.meta.get("timesteps", 0))
        row = {"policy": Path(path).name if path != shipped else "shipped", "transitions": n,
               "episodes": episodes(pol, n), "score_p99_ms": s["score_p99_ms"]} | {"regimes": per_regime(s["validation"])}
        rows.append(row)
        regimes = "  ".join(f"{k} {v['p99_ms']:.2f} ms @ {v['ratio']:.2f}" for k, v in row["regimes"].items())
        print(f"{row['policy']:>24}: {n:>7} transitions, {row['episodes']:6.0f} episodes; geo-mean "
              f"{row['score_p99_ms']:.3f} ms; {regimes}", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "curve.json").write_text(json.dumps(rows, indent=2) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    mine = [r for r in rows if r["policy"] != "shipped" and math.isfinite(r["score_p99_ms"])]
    ax.plot([r["episodes"] for r in mine], [r["score_p99_ms"] for r in mine], "o-", label=a.run.name)
    if not a.no_shipped:
        ax.axhline(rows[-1]["score_p99_ms"], color="k", ls="--", lw=1, label="shipped base")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("validation P99, geometric mean (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out / "curve.png", dpi=110)
    print(f"-> {a.out}/curve.json, curve.png")


if __name__ == "__main__":
    main()
