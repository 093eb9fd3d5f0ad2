"""A small HSTU-style model (Zhai et al. 2024) with a cacheable prefix and M-FALCON scoring.

Each layer: h -> LayerNorm -> one linear to U, V, Q, K -> SiLU; pointwise attention
A = SiLU(Q K^T) under a causal mask (no softmax); out = W_o (LayerNorm(A V) * U) + h.
Each query's attention is divided by the number of keys it sees (i + 1 for position i), not by
the sequence length, so a position's output never depends on what comes after it: that is
what makes its K/V cacheable and `extend` exact. Relative attention bias is left out.

Scoring (M-FALCON): candidates are extra queries at every layer; each attends to the whole
history (cached prefix + new tokens) and to itself, never to another candidate, so a
candidate's score does not depend on which other candidates share the batch. The score is a
linear head on the candidate's last hidden state.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from helmgr.core.profiles import ModelProfile
from helmgr.real.kv import KVLayout, PrefixKV


def shrink(profile: ModelProfile, factor: int) -> ModelProfile:
    """The same model with every width divided by `factor` (layers and heads kept), so tests
    and CPU runs exercise the real code path at a size that runs in milliseconds."""
    widths = ("d_qk", "d_v", "d_model", "emb_dim")
    if factor < 1 or any(getattr(profile, w) % factor for w in widths):
        raise ValueError(f"shrink factor must be >= 1 and divide {', '.join(widths)}, got {factor}")
    return replace(profile, name=f"{profile.name}/{factor}", **{w: getattr(profile, w) // factor for w in widths})


def _weight(rows: int, cols: int, g: torch.Generator, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.randn(rows, cols, generator=g, dtype=dtype) / cols ** 0.5)


class HSTUBlock(nn.Module):
    def __init__(self, p: ModelProfile, g: torch.Generator, dtype: torch.dtype):
        super().__init__()
        self.heads, self.d_qk, self.d_v = p.heads, p.d_qk, p.d_v
        self.w_uvqk = _weight(p.heads * (2 * p.d_v + 2 * p.d_qk), p.d_model, g, dtype)
        self.w_out = _weight(p.d_model, p.heads * p.d_v, g, dtype)

    def uvqk(self, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """U (n, heads*d_v), then V, Q, K as (n, heads, d)."""
        z = F.silu(F.layer_norm(h, h.shape[-1:]) @ self.w_uvqk.T)
        hv, hq = self.heads * self.d_v, self.heads * self.d_qk
        u, v, q, k = z.split([hv, hv, hq, hq], dim=-1)
        n, heads = h.shape[0], self.heads
        return u, v.reshape(n, heads, self.d_v), q.reshape(n, heads, self.d_qk), k.reshape(n, heads, self.d_qk)

    def output(self, h: torch.Tensor, attn: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Residual + W_o (LayerNorm(attention output) * U); `attn` is (n, heads, d_v)."""
        a = attn.reshape(h.shape[0], -1)
        return h + (F.layer_norm(a, a.shape[-1:]) * u) @ self.w_out.T

    def forward(self, h: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor):
        """The new positions `h` after `past_k.shape[0]` cached ones; returns (h', K_all, V_all)."""
        u, v, q, k = self.uvqk(h)
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        pos = past_k.shape[0] + torch.arange(h.shape[0], device=h.device)
        visible = torch.arange(keys.shape[0], device=h.device)[None, :] <= pos[:, None]
        a = F.silu(torch.einsum("thd,shd->hts", q, keys)) * (visible / (pos[:, None] + 1))
        return self.output(h, torch.einsum("hts,shd->thd", a, values), u), keys, values

    def candidates(self, c: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Candidates `c` attending to the history's `keys`/`values` and to themselves only."""
        u, v, q, k = self.uvqk(c)
        history = F.silu(torch.einsum("chd,nhd->hcn", q, keys))
        own = F.silu((q * k).sum(-1, keepdim=True))                     # (c, heads, 1)
        attn = (torch.einsum("hcn,nhd->chd", history, values) + own * v) / (keys.shape[0] + 1)
        return self.output(c, attn, u)


class HSTUModel(nn.Module):
    """Token embeddings (n, features_per_token * emb_dim) in, hidden states and scores out.
    Weights are drawn from `generator`; the model never touches global random state."""

    def __init__(self, profile: ModelProfile, generator: torch.Generator, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.profile = profile
        self.layout = KVLayout.from_profile(profile, dtype)
        self.in_dim = profile.features_per_token * profile.emb_dim
        self.w_in = _weight(profile.d_model, self.in_dim, generator, dtype)
        self.blocks = nn.ModuleList(HSTUBlock(profile, generator, dtype) for _ in range(profile.layers))
        self.w_head = _weight(1, profile.d_model, generator, dtype)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"token embeddings must be (n, {self.in_dim}), got {tuple(x.shape)}")
        return x.to(self.w_in.dtype) @ self.w_in.T

    @torch.no_grad()
    def prefill(self, x: torch.Tensor) -> tuple[torch.Tensor, PrefixKV]:
        """Hidden states of all positions of `x`, and every layer's K/V."""
        return self.extend(x, self.layout.empty(x.device))

    @torch.no_grad()
    def extend(self, x_new: torch.Tensor, cached: PrefixKV) -> tuple[torch.Tensor, PrefixKV]:
        """Hidden states of only the new positions `x_new`, attending to the `cached` prefix;
        returns them with the K/V of prefix + new positions."""
        if len(cached.k) != len(self.blocks):
            raise ValueError(f"cached K/V has {len(cached.k)} layers, the model {len(self.blocks)}")
        h, ks, vs = self.embed(x_new), [], []
        for block, past_k, past_v in zip(self.blocks, cached.k, cached.v):
            h, k, v = block(h, past_k, past_v)
            ks.append(k)
            vs.append(v)
        return h, PrefixKV(tuple(ks), tuple(vs))

    @torch.no_grad()
    def score(self, history: PrefixKV, cand_emb: torch.Tensor) -> torch.Tensor:
        """One score per candidate (M-FALCON): candidates attend to the `history` K/V of every
        layer and to themselves."""
        c = self.embed(cand_emb)
        for block, k, v in zip(self.blocks, history.k, history.v):
            c = block.candidates(c, k, v)
        return (c @ self.w_head.T).squeeze(-1)
