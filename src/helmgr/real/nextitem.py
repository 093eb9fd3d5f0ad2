"""Training the runtime's HSTU on a log: next-item prediction, scored the way serving scores.

Data: each user's items in time order (`history.store.by_user`). Each user's last item is held
out for evaluation; the model trains on the rest.

Objective: at a position t of a user's sequence, the next item must outscore `negatives` items
drawn from the catalogue (one draw per step, shared by the batch; half uniformly, half by
popularity), by sampled softmax cross entropy with each score less the log of its sampling
probability (the logQ correction: what the full softmax over the catalogue would learn, so that
ranking the whole catalogue is what is trained). Every score is M-FALCON's (`HSTUModel.score`):
the candidate attends, at every layer, to the history's K/V up to t and to itself, divided by
t + 2, with the relative attention bias of its distance to each key. `candidate_scores` computes
the scores of all of a batch's positions at once with the same blocks, masks in place of the
prefix cut, so the model trained is the one served. A step draws `batch` users, a window of at
most `window` consecutive items from each (anywhere in its sequence: the model knows distances,
not absolute positions, so a window reads as a shorter history) and `positions` target positions
in each window.

Evaluation (`evaluate`): for each user, the history without its last item is prefilled and every
item of the catalogue is scored (`HSTUModel.prefill` + `score`, what a replica runs); the rank
of the held-out item is the number of items scoring strictly higher among those the user has not
acted on (the usual full ranking with the history masked). HR@10 counts ranks below 10, NDCG@10
adds 1 / log2(rank + 2) for them. Popularity ranks by training counts the same way. A NaN score
ranks below every number: a held-out item scored NaN ranks last, behind every other unseen item
(a diverged model scores NaN everywhere, and must not read as a perfect one).

Training that diverges (a loss or a weight no longer finite: too large a learning rate) stops with
a HelmInputError naming the step and the rate; `train_memory_bytes` estimates what training asks
of memory, so that a command can refuse a model too large before building it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import ModelProfile
from helmgr.real.model import BUCKETS, HSTUModel
from helmgr.real.runtime import runtime_model


@dataclass(frozen=True)
class Sequences:
    """Every user's items in time order, users one after another (`offsets[u]:offsets[u + 1]`)."""

    items: np.ndarray
    offsets: np.ndarray
    n_items: int

    @classmethod
    def from_log(cls, log) -> "Sequences":
        from helmgr.history.store import by_user
        items, offsets = by_user(log.user, log.item, log.time, log.n_users)
        return cls(items, offsets, log.n_items)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def user(self, u: int) -> np.ndarray:
        return self.items[self.offsets[u]:self.offsets[u + 1]]

    def evaluable(self) -> np.ndarray:
        """Users with a history left once their last item is held out."""
        return np.flatnonzero(self.lengths >= 2)

    def train_counts(self) -> np.ndarray:
        """Each item's count in the training part (every user's items but the last)."""
        last = self.offsets[1:][self.lengths > 0] - 1
        counts = np.bincount(self.items, minlength=self.n_items)
        return counts - np.bincount(self.items[last], minlength=self.n_items)


@dataclass(frozen=True)
class TrainConfig:
    preset: str = "small"
    shrink: int = 16          # the runtime's model (`runtime_model`): widths of small / 16 by default
    steps: int = 4000
    batch: int = 16           # users a step
    window: int = 64          # items of a user's sequence a step reads
    positions: int = 8        # target positions a user contributes to a step
    negatives: int = 31
    lr: float = 3e-3
    seed: int = 0
    eval_users: int = 2000    # users evaluated (a seeded sample when the log has more)


def candidate_scores(model: HSTUModel, x: torch.Tensor, pos: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Scores (B, P, M) of candidates `cand` (B, P, M, in_dim) at positions `pos` (B, P) of
    histories `x` (B, L, in_dim): candidate m of (b, p) sees history b's positions 0..pos[b, p],
    exactly as `HSTUModel.score` after a prefill of those positions. Differentiable."""
    b, n, _ = x.shape
    p, m = cand.shape[1:3]
    t = torch.arange(n, device=x.device)
    hist_dist = t[:, None] - t[None, :]                                      # (L, S)
    hist_w = (hist_dist >= 0) / (t[:, None] + 1.0)                           # causal, / (l + 1)
    cand_dist = pos[:, :, None] + 1 - t                                      # (B, P, S): the candidate after pos
    cand_mask = (cand_dist > 0).to(x.dtype)[:, :, None, None, :]             # (B, P, 1, 1, S)
    cand_div = (pos + 2.0).to(x.dtype)[:, :, None].expand(b, p, m).reshape(-1, 1, 1)
    h, c = model.embed(x.reshape(b * n, -1)), model.embed(cand.reshape(b * p * m, -1))
    for block in model.blocks:
        u, v, q, k = block.uvqk(h)
        v, q, k = (a.reshape(b, n, block.heads, -1) for a in (v, q, k))
        a = F.silu(torch.einsum("blhd,bshd->bhls", q, k) + block.bias(hist_dist.clamp(min=0))) * hist_w
        attn = torch.einsum("bhls,bshd->blhd", a, v).reshape(b * n, block.heads, -1)
        cu, cv, cq, ck = block.uvqk(c)
        rab = block.bias(cand_dist.clamp(min=0)).permute(1, 2, 0, 3)[:, :, None]      # (B, P, 1, heads, S)
        s = F.silu(torch.einsum("bpmhd,bshd->bpmhs", cq.reshape(b, p, m, block.heads, -1), k) + rab) * cand_mask
        hist_part = torch.einsum("bpmhs,bshd->bpmhd", s, v).reshape(b * p * m, block.heads, -1)
        own = F.silu((cq * ck).sum(-1, keepdim=True) + block.rab[:, :1]) * cv
        h, c = block.output(h, attn, u), block.output(c, (hist_part + own) / cand_div, cu)
    return (c @ model.w_head.T).reshape(b, p, m)


def _batch(seqs: Sequences, users: np.ndarray, cfg: TrainConfig, rng: np.random.Generator, sampling: np.ndarray):
    """Item ids of a step: windows (B, L) padded with 0, target positions (B, P), candidates
    (B, P, M) with the next item first."""
    wins = []
    for u in users:
        s = seqs.user(u)[:-1]                          # the last item is held out
        start = rng.integers(0, len(s) - cfg.window + 1) if len(s) > cfg.window else 0
        wins.append(s[start:start + cfg.window])
    n = max(len(w) for w in wins)
    ids = np.zeros((len(wins), n), np.int64)
    pos = np.empty((len(wins), cfg.positions), np.int64)
    nxt = np.empty_like(pos)
    for i, w in enumerate(wins):
        ids[i, :len(w)] = w
        pos[i] = rng.integers(0, len(w) - 1, cfg.positions)       # t predicts w[t + 1]
        nxt[i] = w[pos[i] + 1]
    neg = rng.choice(seqs.n_items, cfg.negatives, p=sampling)
    cand = np.concatenate([nxt[:, :, None], np.broadcast_to(neg, (*pos.shape, cfg.negatives))], axis=2)
    return torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(cand)


def train(seqs: Sequences, cfg: TrainConfig, on_step: Callable[[int, float], None] | None = None):
    """The model and item table trained on `seqs`; returns (model, table, mean loss of the last
    tenth of the steps)."""
    trainable = seqs.evaluable()
    trainable = trainable[seqs.lengths[trainable] >= 3]          # two items left to learn a transition from
    if len(trainable) == 0:
        raise HelmInputError("no user of the log has 3 or more items: nothing to learn next items from")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = HSTUModel(runtime_model(cfg.preset, cfg.shrink), gen)
    table = nn.Parameter(torch.randn(seqs.n_items, model.in_dim, generator=gen) * 0.1)
    opt = torch.optim.Adam([*model.parameters(), table], lr=cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    counts = seqs.train_counts().astype(np.float64)
    sampling = 0.5 / seqs.n_items + 0.5 * counts / counts.sum()     # half uniform, half by popularity
    log_q = torch.from_numpy(np.log(sampling)).float()
    losses = []
    model.train()
    for step in range(cfg.steps):
        users = rng.choice(trainable, min(cfg.batch, len(trainable)), replace=False)
        ids, pos, cand = _batch(seqs, users, cfg, rng, sampling)
        logits = candidate_scores(model, table[ids], pos, table[cand]) - log_q[cand]
        logits[:, :, 1:][cand[:, :, 1:] == cand[:, :, :1]] = -torch.inf         # a negative that is the next item
        logits = logits.reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.int64))
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            raise _diverged(cfg, step + 1, f"the loss is {losses[-1]}")
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step:
            on_step(step + 1, losses[-1])
    if not all(bool(torch.isfinite(w).all()) for w in (*model.parameters(), table)):
        raise _diverged(cfg, cfg.steps, "a weight is no longer finite")
    model.eval()
    tail = losses[-max(1, cfg.steps // 10):]
    return model, table.detach(), float(np.mean(tail))


def _diverged(cfg: TrainConfig, step: int, what: str) -> HelmInputError:
    return HelmInputError(f"training diverged at step {step} of {cfg.steps} ({what}): --lr {cfg.lr:g} is too "
                          "large for this model; lower it")


FLOAT_BYTES = 4
COPIES = 4                # a weight, its gradient and Adam's two moments
SAVED_PER_LAYER = 4       # row vectors of each width a layer keeps for the backward pass: the estimate
                          # gives 5.6, 2.6 and 0.9 GiB for large/1, large/2 and small/1 on 60 items,
                          # measured 5.1, 2.3 and 0.9 GiB of peak RSS over the interpreter's


def param_count(p: ModelProfile) -> int:
    """Weights of `HSTUModel(p)` (w_in, each block's w_uvqk, w_out and rab, w_head), not built."""
    uvqk = p.heads * (2 * p.d_v + 2 * p.d_qk)
    block = uvqk * p.d_model + p.d_model * p.heads * p.d_v + p.heads * BUCKETS
    return p.d_model * p.features_per_token * p.emb_dim + p.layers * block + p.d_model


def train_memory_bytes(cfg: TrainConfig, n_items: int) -> float:
    """What `train` asks of memory: every weight and the item table `COPIES` times, and a step's
    activations (its history and candidate rows, gathered with their gradients, and what each
    layer keeps of them for the backward pass)."""
    p = runtime_model(cfg.preset, cfg.shrink)
    in_dim = p.features_per_token * p.emb_dim
    rows = cfg.batch * (cfg.window + cfg.positions * (cfg.negatives + 1))
    widths = p.d_model + p.heads * (2 * p.d_v + 2 * p.d_qk) + p.heads * p.d_v
    per_row = 3 * in_dim + p.layers * SAVED_PER_LAYER * widths
    return FLOAT_BYTES * (COPIES * (param_count(p) + n_items * in_dim) + rows * per_row)


@dataclass(frozen=True)
class Ranking:
    hr10: float
    ndcg10: float
    users: int

    def to_dict(self) -> dict:
        return {"hr@10": round(self.hr10, 4), "ndcg@10": round(self.ndcg10, 4), "users": self.users}


def ranking(ranks: np.ndarray) -> Ranking:
    top = ranks < 10
    return Ranking(float(top.mean()), float((top / np.log2(ranks + 2.0)).mean()), len(ranks))


def eval_users(seqs: Sequences, n: int, seed: int) -> np.ndarray:
    """The users evaluated: every evaluable one, or a seeded sample of `n` of them (sorted)."""
    users = seqs.evaluable()
    if len(users) > n:
        users = np.sort(np.random.default_rng([seed, 7]).choice(users, n, replace=False))
    return users


def held_out_rank(scores: np.ndarray, seq: np.ndarray) -> int:
    """The rank of `seq`'s last item by `scores` (one per catalogue item): how many items the
    user has not acted on (`seq[:-1]`) score strictly higher; a NaN score ranks below every
    number, so a NaN held-out item ranks behind every other unseen one (an app's JSON null reads
    as NaN)."""
    scores = np.asarray(scores, np.float64)
    target = scores[seq[-1]]
    higher = np.ones(len(scores), bool) if np.isnan(target) else scores > target
    higher[seq[-1]] = False
    higher[seq[:-1]] = False
    return int(higher.sum())


@torch.no_grad()
def model_ranks(model: HSTUModel, table: torch.Tensor, seqs: Sequences, users: np.ndarray) -> np.ndarray:
    """The held-out item's rank among the whole catalogue's scores, per user (the runtime's calls)."""
    all_rows = table if table.shape[0] == seqs.n_items else table[:seqs.n_items]
    ranks = np.empty(len(users), np.int64)
    for i, u in enumerate(users):
        s = seqs.user(u)
        _, kv = model.prefill(table[torch.from_numpy(s[:-1])])
        ranks[i] = held_out_rank(model.score(kv, all_rows).numpy(), s)
    return ranks


def popularity_ranks(seqs: Sequences, users: np.ndarray) -> np.ndarray:
    counts = seqs.train_counts()
    return np.array([held_out_rank(counts, seqs.user(u)) for u in users], np.int64)


def evaluate(model: HSTUModel, table: torch.Tensor, seqs: Sequences, n_users: int, seed: int) -> dict:
    users = eval_users(seqs, n_users, seed)
    t0 = time.perf_counter()
    result = {"model": ranking(model_ranks(model, table, seqs, users)).to_dict(),
              "popularity": ranking(popularity_ranks(seqs, users)).to_dict()}
    result["eval_s"] = round(time.perf_counter() - t0, 2)
    return result


def describe(cfg: TrainConfig) -> dict:
    d = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    d["objective"] = (f"next item against {cfg.negatives} negatives (half uniform, half by popularity), "
                      "sampled softmax with logQ correction")
    return d


__all__ = ["Sequences", "TrainConfig", "candidate_scores", "train", "evaluate", "model_ranks", "popularity_ranks",
           "ranking", "describe", "param_count", "train_memory_bytes"]
