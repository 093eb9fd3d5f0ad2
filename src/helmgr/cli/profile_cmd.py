"""`helmgr profile`: what a node profile holds at a given split, and what requests cost on it."""
from __future__ import annotations

import click

from helmgr.cli.output import emit_json, json_option, stdout, table
from helmgr.cli.types import POSITIVE, Finite
from helmgr.core.costs import CostModel
from helmgr.core.profiles import GIB, available, node_profile


@click.command()
@click.option("--hardware", default="a100-80g", show_default=True,
              help=f"Hardware preset ({', '.join(sorted(available('hardware')))}) or a profile TOML file.")
@click.option("--model", default="large", show_default=True,
              help=f"Model preset ({', '.join(sorted(available('model')))}) or a profile TOML file.")
@click.option("--ratio", type=Finite(0.0, 1.0), default=0.5, show_default=True, help="EMB share of the pool, in [0, 1].")
@click.option("--prefix", type=click.IntRange(0, 10**7), default=1000, show_default=True, help="History tokens of the example request.")
@click.option("--new-tokens", type=click.IntRange(0, 10**6), default=4, show_default=True)
@click.option("--page-mib", type=POSITIVE, default=2.0, show_default=True)
@json_option
def profile(hardware, model, ratio, prefix, new_tokens, page_mib, as_json):
    """Show a node's pool at an EMB:KV split and the service time of an example request.

    \b
    helmgr profile --hardware h100-80g --model small --ratio 0.3
    """
    p = node_profile(hardware, model, page_mib)
    cost = CostModel.from_profile(p)
    m = p.model
    emb_bytes = ratio * p.pool_budget_bytes
    kv_bytes = p.pool_budget_bytes - emb_bytes
    hit = cost.breakdown(prefix, prefix, new_tokens, m.candidates, misses=0)
    miss = cost.breakdown(prefix, 0, new_tokens, m.candidates, misses=0)
    ids = prefix + new_tokens + m.candidates
    summary = {
        "hardware": p.hardware.name, "model": m.name, "ratio": ratio,
        "pool_budget_gib": p.pool_budget_bytes / GIB,
        "pages": p.pool_budget_bytes // p.page_bytes,
        "row_bytes": m.row_bytes,
        "kv_bytes_per_token": m.kv_bytes_per_token,
        "emb_rows": int(emb_bytes // m.row_bytes),
        "kv_tokens": int(kv_bytes // m.kv_bytes_per_token),
        "kv_users_at_prefix": int(kv_bytes // max(1, (prefix + new_tokens) * m.kv_bytes_per_token)),
        "service_ms_kv_hit": hit.total_s * 1e3,
        "service_ms_kv_miss": miss.total_s * 1e3,
        "ms_per_10pct_emb_miss_on_kv_miss": cost.miss_s(ids // 10) * 1e3,
        "slo_ms": m.slo_ms,
    }
    if as_json:
        emit_json(summary)
    else:
        stdout.print(table(f"{p.hardware.name} + {m.name} at ratio {ratio}", summary))
