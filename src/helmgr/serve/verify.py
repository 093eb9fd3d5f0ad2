"""Served scores checked against the model computed from scratch (`helmgr loadgen --trace LOG
--model DIR`).

A replay of a log against an app that serves a store built from that log: a user's history when
a request is served is the log's sequence, then the new items of that user's requests that the
app appended before it, then the request's own new items. The app serves a user's requests one
at a time, in the order they reach its ingress, which need not be the order they were sent (two
sent a few ms apart can arrive swapped); an appended request's prefix is the user's length when
it was served, so a user's answers ordered by their prefix are the order the app served them
in. For each answered request whose prefix is that length, the checkpoint's model prefills the
whole history from nothing and scores the candidates; a score
further than `ATOL + RTOL x |score|` from the served one makes the answer a mismatch, whether
the replica had the prefix's K/V cached or recomputed it. An answer with another prefix (the
store held appends from an earlier replay, or lost some) cannot be checked and is counted apart.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.errors import HelmInputError

ATOL = RTOL = 1e-4


def check_scores(sent: list, answers: list, log, checkpoint, already: dict | None = None) -> dict:
    """{"score_checked", "score_mismatch", "score_unchecked", "score_max_diff"} for the replay of
    `log` (a `workload.trace.Log`) that sent `sent` (bodies with user_id, new_items, candidates)
    and got `answers` (in the same order; status, prefix_len, scores, appended); `already`: each
    user's items an earlier part of the replay appended (a resumed replay)."""
    import torch

    from helmgr.history.store import by_user

    items, offsets = by_user(log.user, log.item, log.time, log.n_users)
    appended: dict[int, list[int]] = {u: list(v) for u, v in (already or {}).items()}
    model, table = checkpoint.model, checkpoint.table
    checked = mismatch = unchecked = 0
    worst = 0.0
    served = sorted((a.prefix_len, k) for k, a in enumerate(answers) if a.status == 200)   # in served order, per user
    for _, k in served:
        s, a = sent[k], answers[k]
        user, new = s.body["user_id"], s.body["new_items"]
        past = appended.setdefault(user, [])
        base = items[offsets[user]:offsets[user + 1]] if user < len(offsets) - 1 else items[:0]
        if a.prefix_len != len(base) + len(past):
            unchecked += 1
        else:
            history = torch.from_numpy(np.concatenate([base, np.asarray(past + new, np.int64)]))
            with torch.no_grad():
                _, kv = model.prefill(table[history])
                ref = model.score(kv, table[torch.as_tensor(s.body["candidates"])]).numpy()
            diff = np.abs(np.asarray(a.scores, np.float64) - ref)
            worst = max(worst, float(diff.max(initial=0.0)))
            mismatch += bool((diff > ATOL + RTOL * np.abs(ref)).any())
            checked += 1
        if a.appended:
            past += new
    return {"score_checked": checked, "score_mismatch": mismatch, "score_unchecked": unchecked,
            "score_max_diff": worst}


def http_ranks(url: str, seqs, users, timeout_s: float = 60.0) -> np.ndarray:
    """The held-out item's rank for each of `users`, from the app's scores (`nextitem.model_ranks`
    through HTTP): the app serves a store built from the same log, so a user's history there is
    its whole sequence; the request asks for the prefix without the last two items, sends the
    second-to-last as its new item (off the store's history: nothing is appended) and every item
    of the catalogue as candidates, so the model sees exactly the history the offline evaluation
    prefills. Ranks count the unseen items scoring strictly higher, as offline."""
    import json
    import urllib.error
    import urllib.request

    from helmgr.real.nextitem import held_out_rank

    ranks = np.empty(len(users), np.int64)
    cands = list(range(seqs.n_items))
    for i, u in enumerate(users):
        s = seqs.user(int(u))
        body = {"user_id": int(u), "prefix_len": len(s) - 2, "new_items": [int(s[-2])], "candidates": cands}
        req = urllib.request.Request(url.rstrip("/") + "/v1/recommend", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                scores = np.asarray(json.loads(r.read())["scores"])
        except urllib.error.HTTPError as exc:
            raise HelmInputError(f"user {int(u)}: the app answered {exc.code}: {exc.read()[:300]!r}") from None
        except OSError as exc:
            raise HelmInputError(f"--url {url!r}: cannot reach the app ({exc})") from None
        ranks[i] = held_out_rank(scores, s)
    return ranks
