"""A small HSTU-style model (Zhai et al. 2024) with a cacheable prefix and M-FALCON scoring.

Each layer: h -> LayerNorm -> one linear to U, V, Q, K -> SiLU; pointwise attention
A = SiLU(Q K^T) under a causal mask (no softmax); out = W_o (LayerNorm(A V) * U) + h.
Each query's attention is divided by the number of keys it sees (i + 1 for position i), not by
the sequence length, so a position's output never depends on what comes after it: that is
what makes its K/V cacheable and `extend` exact. A learned relative attention bias (one value a
head per bucket of query-to-key distance, log-spaced past 8; HSTU's positional `rab`) is added
to Q K^T before the SiLU: it depends on distances only, so cached K/V stay exact. It starts at
zero, so an untrained model attends by content alone.

Scoring (M-FALCON): candidates are extra queries at every layer; each attends to the whole
history (cached prefix + new tokens) and to itself, never to another candidate, so a
candidate's score does not depend on which other candidates share the batch. The score is a
linear head on the candidate's last hidden state.

Batches (`extend_batch`, `score_batch`) are jagged: every per-position op (LayerNorm, the UVQK
and output projections, SiLU, the residual) runs once on the batch's rows concatenated, and
attention runs on each request's own rows and keys (its slice of the packed rows, at its offset),
so a batch computes its requests' real tokens and nothing for padding: a KV hit's few new tokens
next to a miss's whole history cost what they cost alone. Each request's outputs are the ones it
gets alone (tested). On a GPU the per-request attention is a few small kernels per request and
layer, the price of exact work without a jagged attention kernel.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple, Sequence

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


BUCKETS = 32         # relative attention bias: distances 0..7 each their own, then 4 a doubling, 256+ the last


def bucket(distance: torch.Tensor) -> torch.Tensor:
    """The bias bucket of each distance (>= 0) between a query's position and its key's."""
    far = 8 + (torch.log2(distance.clamp(min=8).float() / 8) * 4).long()
    return torch.where(distance < 8, distance, far).clamp(max=BUCKETS - 1)


def _weight(rows: int, cols: int, g: torch.Generator, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.randn(rows, cols, generator=g, dtype=dtype) / cols ** 0.5)


class HSTUBlock(nn.Module):
    def __init__(self, p: ModelProfile, g: torch.Generator, dtype: torch.dtype):
        super().__init__()
        self.heads, self.d_qk, self.d_v = p.heads, p.d_qk, p.d_v
        self.w_uvqk = _weight(p.heads * (2 * p.d_v + 2 * p.d_qk), p.d_model, g, dtype)
        self.w_out = _weight(p.d_model, p.heads * p.d_v, g, dtype)
        self.rab = nn.Parameter(torch.zeros(p.heads, BUCKETS, dtype=dtype))    # zero until trained

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

    def bias(self, distance: torch.Tensor) -> torch.Tensor:
        """The relative attention bias of a query `distance` positions after its key (any shape
        of distances >= 0): one value per head, (heads, *distance.shape)."""
        return self.rab[:, bucket(distance)]

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Causal pointwise attention of the last `len(q)` positions over `keys`/`values` (all
        positions so far); position i's sum is divided by its i + 1 keys. (t, heads, d_v) out.

        The keys are taken last first, so that the relative bias of query i and key j (a
        function of i - j) runs along a diagonal: with the keys reversed it is one strided view
        of a per-distance vector of 2n - 1 values (`_toeplitz`), where a per-pair gather costs
        40-80 % of a miss's model time on CPU."""
        n, t = keys.shape[0], q.shape[0]
        pos = n - t + torch.arange(t, device=q.device)
        back = (n - 1) - torch.arange(n, device=q.device)             # the key at each reversed place
        dist = pos[:, None] - back[None, :]
        scores = torch.einsum("thd,shd->hts", q, keys.flip(0)) + self._toeplitz(n, t)
        return torch.einsum("hts,shd->thd", F.silu(scores) * ((dist >= 0) / (pos[:, None] + 1)), values.flip(0))

    def _toeplitz(self, n: int, t: int) -> torch.Tensor:
        """(heads, t, n): the bias of the last `t` of `n` positions over the `n` keys taken last
        first, as a view: entry (i, j) is the bias of distance (n - t + i) - (n - 1 - j), i.e.
        of ext's entry n - t + i + j, where ext[m] is the bias of distance m - (n - 1) (the
        negative distances, future keys, get distance 0's: they are masked out)."""
        ext = self.bias((torch.arange(2 * n - 1, device=self.rab.device) - (n - 1)).clamp(min=0)).contiguous()
        return ext.as_strided((ext.shape[0], t, n), (ext.stride(0), 1, 1), ext.storage_offset() + n - t)

    def attend_candidates(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                          values: torch.Tensor) -> torch.Tensor:
        """Candidates (queries `q`, their own `k`, `v`) over the history's `keys`/`values` and
        themselves only, divided by the history's keys + 1: a candidate stands at the position
        after the history's last. (c, heads, d_v) out."""
        n = keys.shape[0]
        dist = n - torch.arange(n, device=q.device)
        history = F.silu(torch.einsum("chd,nhd->hcn", q, keys) + self.bias(dist)[:, None, :])
        own = F.silu((q * k).sum(-1, keepdim=True) + self.rab[:, :1])     # (c, heads, 1): distance 0
        return (torch.einsum("hcn,nhd->chd", history, values) + own * v) / (n + 1)

    def forward(self, h: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor):
        """The new positions `h` after `past_k.shape[0]` cached ones; returns (h', K_all, V_all)."""
        u, v, q, k = self.uvqk(h)
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        return self.output(h, self.attend(q, keys, values), u), keys, values

    def candidates(self, c: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Candidates `c` attending to the history's `keys`/`values` and to themselves only."""
        u, v, q, k = self.uvqk(c)
        return self.output(c, self.attend_candidates(q, k, v, keys, values), u)

    def forward_batch(self, h: torch.Tensor, past_k: Sequence[torch.Tensor], past_v: Sequence[torch.Tensor],
                      new: list[int]):
        """`forward` for a batch: `h` the computed rows of every request concatenated (`new[b]`
        of request b), `past_k` / `past_v` each request's cached rows; returns (h', K, V), K and V
        one tensor per request (its cached rows, then its new ones)."""
        u, v, q, k = self.uvqk(h)
        keys = [torch.cat([pk, kb]) for pk, kb in zip(past_k, k.split(new))]
        values = [torch.cat([pv, vb]) for pv, vb in zip(past_v, v.split(new))]
        attn = torch.cat([self.attend(qb, kb, vb) for qb, kb, vb in zip(q.split(new), keys, values)])
        return self.output(h, attn, u), keys, values

    def candidates_batch(self, c: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                         counts: list[int]) -> torch.Tensor:
        """`candidates` for a batch: `c` every request's candidates concatenated (`counts[b]` of
        request b), each attending to its own request's `keys[b]` / `values[b]`."""
        u, v, q, k = self.uvqk(c)
        parts = zip(q.split(counts), k.split(counts), v.split(counts), keys, values)
        return self.output(c, torch.cat([self.attend_candidates(*part) for part in parts]), u)


class BatchKV(NamedTuple):
    """A batch's K/V after `extend_batch`: per layer, one (keys, heads, d) tensor per request."""

    k: tuple[list[torch.Tensor], ...]
    v: tuple[list[torch.Tensor], ...]

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(k.shape[0] for k in self.k[0])

    def request(self, b: int) -> PrefixKV:
        """Request b's K/V."""
        return PrefixKV(tuple(k[b] for k in self.k), tuple(v[b] for v in self.v))


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
        order) after its `cached[b]` prefix; returns every request's K/V."""
        if not 0 < len(new) == len(cached) or sum(new) != len(x_new):
            raise ValueError(f"a batch of {len(cached)} prefixes needs as many row counts and their sum of rows, "
                             f"got counts {list(new)} for {len(x_new)} rows")
        h, ks, vs = self.embed(x_new), [], []
        for layer, block in enumerate(self.blocks):
            h, k, v = block.forward_batch(h, [p.k[layer] for p in cached], [p.v[layer] for p in cached], list(new))
            ks.append(k)
            vs.append(v)
        return BatchKV(tuple(ks), tuple(vs))

    @torch.no_grad()
    def score_batch(self, history: BatchKV, cand_emb: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
        """`score` for a batch: request b's `counts[b]` candidates of `cand_emb` (concatenated in
        request order) against its K/V in `history`; one score tensor per request."""
        if len(counts) != len(history.lengths) or sum(counts) != len(cand_emb):
            raise ValueError(f"a batch of {len(history.lengths)} requests needs as many candidate counts and their "
                             f"sum of rows, got counts {list(counts)} for {len(cand_emb)} rows")
        c = self.embed(cand_emb)
        for block, k, v in zip(self.blocks, history.k, history.v):
            c = block.candidates_batch(c, k, v, list(counts))
        return list((c @ self.w_head.T).squeeze(-1).split(list(counts)))
