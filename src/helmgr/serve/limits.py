"""What the ingress refuses before any work, without Ray: item ids outside the table,
a prefix past the model's longest, and a request whose predicted service is over the cost cap.

The cap prices the request's worst case with the router's cost model (`ServeConfig.hardware`
and the runtime's model): no KV hit (the whole prefix recomputed) and every row missed. It is
deterministic — the same body is refused whatever the caches hold — and it bounds what a
replica can be asked for, so a request admitted never holds a replica much longer than the cap.
"""
from __future__ import annotations

from helmgr.core.costs import CostModel
from helmgr.serve.body import BodyError, RecommendRequest, error
from helmgr.serve.config import ServeConfig


class RequestLimits:
    def __init__(self, cfg: ServeConfig):
        self.n_items, self.max_prefix, self.max_cost_s = cfg.n_items, cfg.max_prefix, cfg.max_cost_s
        self.cost = CostModel.from_profile(cfg.node_profile())

    def worst_case_s(self, prefix_len: int, n_new: int, n_candidates: int) -> float:
        """Predicted service with nothing cached: the prefix recomputed and every row missed."""
        ids = prefix_len + n_new + n_candidates
        return self.cost.breakdown(prefix_len, 0, n_new, n_candidates, ids).total_s

    def check(self, req: RecommendRequest, prefix_len: int) -> None:
        """Raise `BodyError` (422, the field named, the input not echoed) or return."""
        for field in ("new_items", "candidates"):
            ids = getattr(req, field)
            bad = next((i for i, x in enumerate(ids) if x >= self.n_items), None) if max(ids) >= self.n_items else None
            if bad is not None:
                raise BodyError(422, [error(["body", field, bad], "less_than",
                                            f"item id {ids[bad]} is not below n_items={self.n_items}")])
        if prefix_len > self.max_prefix:
            raise BodyError(422, [error(["body", "prefix_len"], "less_than_equal",
                                        f"prefix_len {prefix_len} is above max_prefix={self.max_prefix}")])
        cost = self.worst_case_s(prefix_len, len(req.new_items), len(req.candidates))
        if cost > self.max_cost_s:
            raise BodyError(422, [error(["body"], "cost_cap",
                                        f"predicted service {cost * 1e3:.0f} ms (prefix_len {prefix_len}, "
                                        f"{len(req.new_items)} new_items, {len(req.candidates)} candidates, nothing "
                                        f"cached) is above the cap of {self.max_cost_s * 1e3:.0f} ms")])
