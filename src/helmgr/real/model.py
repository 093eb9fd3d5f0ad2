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

Batches (`extend_batch`, `score_batch`) are served the way the PyTorch reference of HSTU serves
a jagged batch (generative-recommenders, `ops/pytorch/pt_hstu_attention.py`, `pytorch_hstu_mha`):
every per-position op (LayerNorm, the UVQK and output projections, SiLU, the residual) runs on
the batch's rows concatenated, and attention on the batch padded to its longest context, one
einsum for all requests. Zero-padded keys and values add nothing (SiLU(0) = 0), so a request's
outputs are the ones it gets alone; the padding costs FLOPs the cost model does not count.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Sequence

import numpy as np
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


def _rows(counts: np.ndarray, width: int) -> np.ndarray:
    """Flat index (request x `width` + i) of row i of each request b's `counts[b]` rows, in order."""
    b = np.repeat(np.arange(len(counts)), counts)
    return b * width + np.arange(len(b)) - np.repeat(np.cumsum(counts) - counts, counts)


def _scatter(rows: torch.Tensor, at: torch.Tensor | None, n: int) -> torch.Tensor:
    """`n` rows of zeros with `rows[i]` written at row `at[i]`; `at` None: `rows` are all n, in order."""
    return rows if at is None else rows.new_zeros((n, *rows.shape[1:])).index_copy_(0, at, rows)


def _gather(rows: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
    return rows if at is None else rows.index_select(0, at)


def _flat(counts: np.ndarray, width: int, device: torch.device) -> torch.Tensor | None:
    """`_rows` on `device`, or None when every request has `width` rows (no padding to place)."""
    return None if np.all(counts == width) else torch.from_numpy(_rows(counts, width)).to(device)


class Jagged(NamedTuple):
    """Where a batch's rows sit in its padded tensors: request b has `past[b]` cached positions,
    then `new[b]` computed ones. Padded keys are (B x S) rows, padded queries (B x T)."""

    keys_at: torch.Tensor | None       # flat (request x S + key) of every cached row, then every new row (None: B = 1)
    queries_at: torch.Tensor | None    # flat (request x T + query) of every new row (None: all T)
    causal: torch.Tensor           # (B, 1, T, S): 1 / (position + 1) where visible, else 0
    shape: tuple[int, int, int]    # B, T (the most new positions), S (the longest context)
    lengths: tuple[int, ...]       # keys of each request: past + new

    @classmethod
    def of(cls, past: Sequence[int], new: Sequence[int], device: torch.device) -> "Jagged":
        past_n, new_n = np.asarray(past, np.int64), np.asarray(new, np.int64)
        lengths = past_n + new_n
        b, t, s = len(past_n), int(new_n.max()), int(lengths.max())
        keys_at = np.concatenate([_rows(past_n, s), _rows(new_n, s) + np.repeat(past_n, new_n)])
        pos = torch.from_numpy(past_n[:, None] + np.arange(t)[None, :]).to(device)            # (B, T)
        visible = torch.arange(s, device=device)[None, None, :] <= pos[:, :, None]
        return cls(None if b == 1 else torch.from_numpy(keys_at).to(device), _flat(new_n, t, device),
                   (visible / (pos[:, :, None] + 1))[:, None], (b, t, s), tuple(lengths.tolist()))


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

    def forward_batch(self, h: torch.Tensor, past_k: list[torch.Tensor], past_v: list[torch.Tensor], j: Jagged):
        """`forward` for a batch: `h` the computed rows of every request concatenated, `past_k`
        / `past_v` each request's cached rows; returns (h', K, V), K and V padded (B, S, heads, d)."""
        u, v, q, k = self.uvqk(h)
        (b, t, s), heads = j.shape, self.heads
        keys = _scatter(torch.cat([*past_k, k]), j.keys_at, b * s).view(b, s, heads, self.d_qk)
        values = _scatter(torch.cat([*past_v, v]), j.keys_at, b * s).view(b, s, heads, self.d_v)
        queries = _scatter(q, j.queries_at, b * t).view(b, t, heads, self.d_qk)
        a = F.silu(torch.einsum("bthd,bshd->bhts", queries, keys)) * j.causal
        out = torch.einsum("bhts,bshd->bthd", a, values).reshape(b * t, heads, self.d_v)
        return self.output(h, _gather(out, j.queries_at), u), keys, values

    def candidates_batch(self, c: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, at: torch.Tensor | None,
                         width: int, scale: torch.Tensor) -> torch.Tensor:
        """`candidates` for a batch: `c` every request's candidates concatenated, at flat rows `at`
        (request x `width` + index; None: `width` each); `keys` / `values` padded (B, S, heads, d), zero past each
        request's length; `scale` per candidate, 1 / (its request's keys + 1)."""
        u, v, q, k = self.uvqk(c)
        b, heads = keys.shape[0], self.heads
        queries = _scatter(q, at, b * width).view(b, width, heads, self.d_qk)
        history = F.silu(torch.einsum("bchd,bnhd->bhcn", queries, keys))
        own = F.silu((q * k).sum(-1, keepdim=True))
        mixed = torch.einsum("bhcn,bnhd->bchd", history, values).reshape(b * width, heads, self.d_v)
        return self.output(c, (_gather(mixed, at) + own * v) * scale[:, None, None], u)


class BatchKV(NamedTuple):
    """A batch's K/V after `extend_batch`: per layer, padded (B, S, heads, d), zero past each
    request's `lengths[b]` keys."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]
    lengths: tuple[int, ...]

    def request(self, b: int) -> PrefixKV:
        """Request b's K/V (views)."""
        n = self.lengths[b]
        return PrefixKV(tuple(k[b, :n] for k in self.k), tuple(v[b, :n] for v in self.v))


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

    @torch.no_grad()
    def extend_batch(self, x_new: torch.Tensor, new: Sequence[int], cached: Sequence[PrefixKV]) -> BatchKV:
        """`extend` for a batch: request b's `new[b]` rows of `x_new` (concatenated in request
        order) after its `cached[b]` prefix; returns every request's K/V, padded."""
        if not 0 < len(new) == len(cached) or sum(new) != len(x_new):
            raise ValueError(f"a batch of {len(cached)} prefixes needs as many row counts and their sum of rows, "
                             f"got counts {list(new)} for {len(x_new)} rows")
        j = Jagged.of([p.tokens for p in cached], new, x_new.device)
        h, ks, vs = self.embed(x_new), [], []
        for layer, block in enumerate(self.blocks):
            h, k, v = block.forward_batch(h, [p.k[layer] for p in cached], [p.v[layer] for p in cached], j)
            ks.append(k)
            vs.append(v)
        return BatchKV(tuple(ks), tuple(vs), j.lengths)

    @torch.no_grad()
    def score_batch(self, history: BatchKV, cand_emb: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
        """`score` for a batch: request b's `counts[b]` candidates of `cand_emb` (concatenated in
        request order) against its K/V in `history`; one score tensor per request."""
        if len(counts) != len(history.lengths) or sum(counts) != len(cand_emb):
            raise ValueError(f"a batch of {len(history.lengths)} requests needs as many candidate counts and their "
                             f"sum of rows, got counts {list(counts)} for {len(cand_emb)} rows")
        n, device = np.asarray(counts, np.int64), cand_emb.device
        at = _flat(n, int(n.max()), device)
        scale = torch.from_numpy(1.0 / (np.repeat(history.lengths, n) + 1.0)).to(device, cand_emb.dtype)
        c = self.embed(cand_emb)
        for block, k, v in zip(self.blocks, history.k, history.v):
            c = block.candidates_batch(c, k, v, at, max(counts), scale)
        return list((c @ self.w_head.T).squeeze(-1).split(list(counts)))
