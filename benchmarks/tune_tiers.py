"""Settings of HELM's adapter v2 and recovery tier, side by side on tuning seeds (issue 22 items 3-4).

    python benchmarks/tune_tiers.py --seeds 101,102 --workloads steady,burst,trend --jobs 2 \
        --config 'now={}' --config 'rprop={"adapter": {"grow": 1.5, "max_step": 0.06}}' \
        --config 'rec95={"controller": {"recovery_ratio": 0.95}}'

Each --config is NAME=JSON: {"adapter": MarginalAdapter's settings, "controller": the recovery
tier's (Controller's recovery_* arguments), "safety": Safety's (e.g. max_slew, the most the
ratio moves a window), "detector": BurstDetector's (e.g. exit_ticks, the windows the burst's end
is averaged over), "router": the HELM router's (e.g. home_slack_s), "policy": HelmPolicy's
(e.g. level_load)}; {} is HELM as it ships. Every (config, preset, workload, seed) is one
full-HELM run on the v2 cluster under the HELM router. --presets
takes HARDWARE[:MODEL[:RATE_SCALE]] items, e.g. `a100-80g,h100-80g::2` (the H100 at twice each
regime's default rate), so a setting can be judged on several presets at once.
The seeds default to the training validation seeds, never the evaluation's 1-3, so that a
setting chosen here is not chosen on the seeds it is then reported on. Printed: one JSON line per
run (P99, window SLO, burst-violation share, mean ratio, adapter steps), then the mean P99 and
violation share per config and workload. Asserts nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def run_one(job: tuple) -> dict:
    from helmgr.policy.policies import HelmPolicy
    from helmgr.routing.helm import Helm
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.sim.metrics import window_ratios

    name, settings, preset, workload, seed, duration = job
    hardware, model, scale = preset
    w = regime_workload(workload, duration, seed, scale)
    cluster = SimConfig(**scenario_cluster("v2"), router="helm", seed=seed, policy="helm", hardware=hardware,
                        model=model)
    safety, detector = settings.get("safety") or {}, settings.get("detector") or {}

    class Tuned(HelmPolicy):
        def attach(self, index, node):
            super().attach(index, node)
            ctl = self.ctl[index]
            for k, v in safety.items():              # each node's own Safety, before its first step
                setattr(ctl.safety, k, v)
            if detector and ctl.detector is not None:
                ctl.detector = dataclasses.replace(ctl.detector, **detector)

    policy = Tuned(adapter_kw=settings.get("adapter"), controller_kw=settings.get("controller"),
                   **(settings.get("policy") or {}))
    res = simulate(cluster, w, policy=policy, router=Helm(**(settings.get("router") or {})))
    s = res.summary
    r = window_ratios(res.series.timeline, cluster.nodes, w.duration_s)
    return {"config": name, "preset": ":".join(map(str, preset)), "workload": workload, "seed": seed,
            "p99_ms": round(s["p99_ms"], 3), "window_slo": round(s["window_slo_satisfaction"], 4),
            "burst_violation_share": s["burst_violation_share"], "mean_ratio": round(float(r.mean()), 3),
            "mean_ratio_by_phase": by_phase(r, w.phases), "steps": s["controller"]["adapter_steps"],
            "utilization": round(s["utilization"], 3), "wall_s": round(s["wall_s"], 1)}


def regime_workload(workload: str, duration: float, seed: int, scale: float = 1.0):
    """The v2 regime `workload` at `scale` x its base rate, built."""
    from helmgr.workload import WorkloadSpec, default_config
    return WorkloadSpec(workload, duration, seed, None if scale == 1.0 else default_config(workload, "v2").rps * scale).build()


def by_phase(r: np.ndarray, phases) -> dict:
    """The mean of a per-window (1 s) series over each phase kind's windows."""
    t = np.arange(len(r)) + 0.5
    out = {}
    for kind in sorted({ph.kind for ph in phases}):
        m = np.zeros(len(r), bool)
        for ph in phases:
            if ph.kind == kind:
                m |= (t > ph.start) & (t <= ph.end)
        if m.any():
            out[kind] = round(float(np.nanmean(r[m])), 3)
    return out


def parse_preset(text: str) -> tuple[str, str, float]:
    """HARDWARE[:MODEL[:RATE_SCALE]] -> (hardware, model, scale); model defaults to large, scale to 1."""
    hw, model, scale = (text.split(":") + ["", ""])[:3]
    return hw, model or "large", float(scale or 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="NAME=JSON (repeatable)")
    ap.add_argument("--workloads", default="steady,burst,trend")
    ap.add_argument("--seeds", default="101,102")
    ap.add_argument("--presets", default="a100-80g", help="HARDWARE[:MODEL[:RATE_SCALE]],... (default a100-80g)")
    ap.add_argument("--duration", type=float, default=360.0)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    configs = {}
    for c in args.config or ["now={}"]:
        name, _, text = c.partition("=")
        configs[name] = json.loads(text or "{}")
    presets = [parse_preset(p) for p in args.presets.split(",")]
    jobs = [(n, cfg, p, wl, int(s), args.duration) for n, cfg in configs.items() for p in presets
            for wl in args.workloads.split(",") for s in args.seeds.split(",")]
    rows = []
    with ProcessPoolExecutor(args.jobs) as ex:
        for row in ex.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\nconfig          preset            workload  mean P99 ms  burst violations")
    for n in configs:
        for p in presets:
            for wl in args.workloads.split(","):
                key = ":".join(map(str, p))
                sel = [r for r in rows if r["config"] == n and r["preset"] == key and r["workload"] == wl]
                v = [r["burst_violation_share"] for r in sel if r["burst_violation_share"] is not None]
                print(f"{n:15s} {key:17s} {wl:9s} {np.mean([r['p99_ms'] for r in sel]):10.2f}  "
                      f"{np.mean(v) if v else float('nan'):.2f}")


if __name__ == "__main__":
    main()
