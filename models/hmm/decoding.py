"""Decoding as pure functions of the log transition table and a sentence's log emission scores.

log_trans: (K+1, K+1) for order 2, (K+1, K+1, K+1) for order 3; the first axes are previous states
(K = <s>), the last axis the next state (K = </s>). The order is log_trans.ndim, K = len(log_trans) - 1.
em: log emission scores, (B, n, K) for a batch of equal-length sentences or (n, K) for one.

- Viterbi, O(n K^2) (order 3: over state pairs), batched over equal-length sentences; each position may
  be restricted to candidate tags (the best `m` by emission score, within `prune` of the best);
  m >= K with prune None is exact.
- The ragged trigram Viterbi: many sentences of any lengths at once, each position with its own number
  of candidates, as flat arrays of (sentence, prev2, prev, cur) triples.
- Greedy: s_t = argmax_s P(s | s_{t-1}) P(o_t | s), batched.
- Beam search of width beta with recombination of hypotheses ending in the same state (order 3: the same
  pair of states): O(n K beta), equal to Viterbi when beta is at least the number of states.
"""

from __future__ import annotations

import numpy as np

NEG = -np.inf


def token_candidates(em: np.ndarray, max_candidates: int,
                     prune: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate tags of each token of em (N, K), best first: ids (N, m), scores (N, m), widths (N,)
    (how many are kept: possible, within `prune` of the best, at most max_candidates)."""
    n, k = em.shape
    m = min(max_candidates, k)
    if m >= k and prune is None:
        return np.broadcast_to(np.arange(k), (n, k)), em, np.full(n, k)
    ids = np.argpartition(-em, m - 1, axis=1)[:, :m] if m < k else np.broadcast_to(np.arange(k), (n, k))
    sc = np.take_along_axis(em, ids, axis=1)
    order = np.argsort(-sc, axis=1, kind="stable")
    ids, sc = np.take_along_axis(ids, order, axis=1), np.take_along_axis(sc, order, axis=1)
    ok = np.isfinite(sc)
    if prune is not None:
        ok &= sc >= sc[:, :1] - prune
    return ids, sc, np.maximum(np.sum(ok, axis=1), 1)


def viterbi_ragged(log_trans: np.ndarray, ids: np.ndarray, sc: np.ndarray, wid: np.ndarray,
                   lengths: np.ndarray) -> list[list[int]]:
    """Trigram Viterbi over state pairs for many sentences at once, each position with its own number
    of candidate tags (no padding to a batch's widest): one step per position handles every sentence
    still running, as flat arrays of (sentence, prev2 slot, prev slot, cur slot) triples.
    ids, sc: (N, m) candidate states and scores of the tokens of the sentences concatenated, best first;
    wid: (N,) how many candidates each token keeps; lengths (S,). Returns state ids per sentence."""
    k, k1, pad = len(log_trans) - 1, len(log_trans), 2
    m = ids.shape[1]
    n_sent = len(lengths)
    order = np.argsort(-lengths, kind="stable")  # longest first: running sentences are a prefix
    ln = lengths[order]
    ext_len = ln + pad
    ext_start = np.concatenate([[0], np.cumsum(ext_len)[:-1]])
    n_ext = int(ext_len.sum())
    src_start = np.concatenate([[0], np.cumsum(lengths)[:-1]])[order]
    local = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln)
    src = np.repeat(src_start, ln) + local
    dst = np.repeat(ext_start + pad, ln) + local
    x_ids = np.full((n_ext, m), k)  # <s> rows: slot 0 = <s>, width 1
    x_sc = np.zeros((n_ext, m))
    x_w = np.ones(n_ext, dtype=np.int64)
    x_ids[dst], x_sc[dst], x_w[dst] = ids[src], sc[src], wid[src]
    flat_lt = log_trans.ravel()
    active = np.searchsorted(-ext_len, -np.arange(int(ext_len.max()) + 1), side="left")  # ext_len > p
    delta = np.zeros(n_sent)  # per running sentence, flat over (slot p-2, slot p-1) pairs
    d_off = np.arange(n_sent + 1)
    steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # per position: (bp, offsets, width at p)
    first_state = np.zeros((n_sent, 2), dtype=np.int64)  # (slot at last-1, slot at last) per sentence

    def finish(lo: int, hi: int, p_last: int, delta: np.ndarray, d_off: np.ndarray) -> None:
        """Best final pair (with the move into </s>) for sorted sentences lo..hi-1 ending at p_last."""
        if lo >= hi:
            return
        r = np.arange(lo, hi)
        ra, rb = ext_start[r] + p_last - 1, ext_start[r] + p_last
        a_w, b_w = x_w[ra], x_w[rb]
        cnt = a_w * b_w
        sent = np.repeat(np.arange(hi - lo), cnt)
        loc = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        i, j = loc // b_w[sent], loc % b_w[sent]
        score = delta[d_off[r][sent] + loc] + flat_lt[(x_ids[ra[sent], i] * k1 + x_ids[rb[sent], j]) * k1 + k]
        starts = np.cumsum(cnt) - cnt
        best = np.maximum.reduceat(score, starts)
        hit = np.where(score == np.repeat(best, cnt), loc, np.iinfo(np.int64).max)
        loc_best = np.minimum.reduceat(hit, starts)
        first_state[r, 0], first_state[r, 1] = loc_best // b_w, loc_best % b_w

    for p in range(pad, int(ext_len.max())):
        n = int(active[p])
        finish(n, int(active[p - 1]), p - 1, delta, d_off)
        r = np.arange(n)
        ra, rb, rc = ext_start[r] + p - 2, ext_start[r] + p - 1, ext_start[r] + p
        a_w, b_w, c_w = x_w[ra], x_w[rb], x_w[rc]
        cnt = a_w * b_w * c_w  # triples per sentence, ordered (prev, cur, prev2) with prev2 fastest
        sent = np.repeat(r, cnt)
        loc = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        aw = a_w[sent]
        i = loc % aw
        jk = loc // aw
        cw = c_w[sent]
        kk, j = jk % cw, jk // cw
        tri = (x_ids[ra[sent], i] * k1 + x_ids[rb[sent], j]) * k1 + x_ids[rc[sent], kk]
        cand = flat_lt[tri] + delta[d_off[sent] + i * b_w[sent] + j]
        groups = b_w * c_w
        size = np.repeat(a_w, groups)  # each (prev, cur) group reduces over its prev2 slots
        starts = np.cumsum(size) - size
        best = np.maximum.reduceat(cand, starts)
        hit = np.where(cand == np.repeat(best, size), i, np.iinfo(np.int64).max)
        bp = np.minimum.reduceat(hit, starts)
        g_sent = np.repeat(r, groups)
        g_loc = np.arange(int(groups.sum())) - np.repeat(np.cumsum(groups) - groups, groups)
        delta = best + x_sc[rc[g_sent], g_loc % c_w[g_sent]]
        d_off = np.concatenate([[0], np.cumsum(groups)])
        steps.append((bp, d_off, c_w))
    last = int(ext_len.max()) - 1
    finish(0, int(active[last]), last, delta, d_off)
    # Back-tracking, all sentences at once: those that end at or after position p are a prefix.
    slot = np.zeros(n_ext, dtype=np.int64)
    cur_j = first_state[:, 0].copy()
    cur_k = first_state[:, 1].copy()
    for p in range(last, pad - 1, -1):
        n = int(active[p])
        r = np.arange(n)
        bp, off, c_w = steps[p - pad]
        slot[ext_start[r] + p] = cur_k[:n]
        prev2 = bp[off[r] + cur_j[:n] * c_w + cur_k[:n]]
        cur_k[:n], cur_j[:n] = cur_j[:n], prev2
    tags = x_ids[np.arange(n_ext), slot]
    out: list[list[int]] = [[] for _ in range(n_sent)]
    for r, s in enumerate(order):
        out[s] = tags[ext_start[r] + pad: ext_start[r] + ext_len[r]].tolist()
    return out


def candidates(em: np.ndarray, m: int, prune: float | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per position the best tags by emission score, best first: ids and scores, each a list over
    positions of (B, m_t) arrays, m_t = the most possible (finite-score) tags any sentence of the
    batch has there, capped at m. With m >= K every tag is kept in tag order (exact Viterbi)."""
    b, n, k = em.shape
    if m >= k:
        ar = np.broadcast_to(np.arange(k), (b, k))
        return [ar] * n, [em[:, t] for t in range(n)]
    ids = np.argpartition(-em, m - 1, axis=2)[:, :, :m]
    sc = np.take_along_axis(em, ids, axis=2)
    if prune is not None:  # TnT-style beam on emissions: far less likely tags are dropped
        sc = np.where(sc >= np.max(sc, axis=2, keepdims=True) - prune, sc, NEG)
    order = np.argsort(-sc, axis=2, kind="stable")
    ids, sc = np.take_along_axis(ids, order, axis=2), np.take_along_axis(sc, order, axis=2)
    need = np.maximum(np.max(np.sum(np.isfinite(sc), axis=2), axis=0), 1)  # (n,)
    return [ids[:, t, :need[t]] for t in range(n)], [sc[:, t, :need[t]] for t in range(n)]


def viterbi_batch(log_trans: np.ndarray, em: np.ndarray, m: int, prune: float | None,
                  lattice: bool = False) -> np.ndarray | tuple[np.ndarray, list, list]:
    """Viterbi over a batch of equal-length sentences. em: (B, n, K) log emission scores.
    Returns (B, n) tag ids; with lattice=True also the per-position deltas and back-pointers (over
    candidate slots; with m >= K slot j is tag j)."""
    k, k1, order = len(log_trans) - 1, len(log_trans), log_trans.ndim
    bsz, n, _ = em.shape
    ids, sc = candidates(em, min(m, k), prune)
    # Extended positions: order-1 boundary positions holding only <s> (id K), then the words.
    pad = order - 1
    cx = [np.full((bsz, 1), k)] * pad + ids  # each (B, m_p)
    sx = [np.zeros((bsz, 1))] * pad + sc
    flat_lt = log_trans.ravel()
    rows = np.arange(bsz)
    deltas, backs = [], []
    path = np.empty((bsz, n), dtype=np.int64)
    if order == 2:
        delta = np.zeros((bsz, 1))  # (B, m_prev)
        for p in range(1, n + 1):
            # cand[b, cur, prev] = delta[b, prev] + log P(cur | prev): the reduced axis is last (fast)
            cand = np.take(flat_lt, cx[p - 1][:, None, :] * k1 + cx[p][:, :, None])  # (B, m_cur, m_prev)
            cand += delta[:, None, :]
            bp = np.argmax(cand, axis=2)  # (B, m_cur)
            delta = np.take_along_axis(cand, bp[:, :, None], axis=2)[:, :, 0] + sx[p]
            deltas.append(delta)
            backs.append(bp)
        slot = np.argmax(delta + np.take(flat_lt, cx[n] * k1 + k), axis=1)  # with the move into </s>
        for p in range(n, 0, -1):
            path[:, p - 1] = np.take_along_axis(cx[p], slot[:, None], axis=1)[:, 0]
            slot = backs[p - 1][rows, slot]
    else:
        delta = np.zeros((bsz, 1, 1))  # (B, m_prev, m_cur) over state pairs, here (<s>, <s>)
        for p in range(2, n + 2):
            a, b, c = cx[p - 2], cx[p - 1], cx[p]
            # cand[b, prev, cur, prev2] = delta[b, prev2, prev] + log P(cur | prev2, prev)
            idx = (b[:, :, None] * k1 + c[:, None, :])[:, :, :, None] + a[:, None, None, :] * (k1 * k1)
            cand = np.take(flat_lt, idx)  # (B, m_prev, m_cur, m_prev2)
            cand += delta.transpose(0, 2, 1)[:, :, None, :]
            bp = np.argmax(cand, axis=3)  # (B, m_prev, m_cur)
            delta = np.take_along_axis(cand, bp[:, :, :, None], axis=3)[:, :, :, 0] + sx[p][:, None, :]
            deltas.append(delta)
            backs.append(bp)
        end = np.take(flat_lt, (cx[n][:, :, None] * k1 + cx[n + 1][:, None, :]) * k1 + k)
        final = (delta + end).reshape(bsz, -1)
        width = delta.shape[2]
        flat = np.argmax(final, axis=1)
        j, cur = flat // width, flat % width
        for p in range(n + 1, 1, -1):
            path[:, p - 2] = np.take_along_axis(cx[p], cur[:, None], axis=1)[:, 0]
            j, cur = backs[p - 2][rows, j, cur], j
    return (path, deltas, backs) if lattice else path


def greedy(log_trans: np.ndarray, em: np.ndarray) -> np.ndarray:
    """s_t = argmax_s P(s | s_{t-2}, s_{t-1}) P(o_t | s), left to right, batched. em: (B, n, K)."""
    k = len(log_trans) - 1
    bsz, n, _ = em.shape
    prev2 = np.full(bsz, k)
    prev = np.full(bsz, k)
    out = np.empty((bsz, n), dtype=np.int64)
    for t in range(n):
        trans = log_trans[prev, :k] if log_trans.ndim == 2 else log_trans[prev2, prev, :k]
        cur = np.argmax(trans + em[:, t], axis=1)
        out[:, t] = cur
        prev2, prev = prev, cur
    return out


def beam(log_trans: np.ndarray, em: np.ndarray, width: int) -> list[int]:
    """Beam search over states with recombination: each step extends the <= width best states by
    every tag (width * K scores), keeps the best path into each state, then the width best states."""
    k, order = len(log_trans) - 1, log_trans.ndim
    n = em.shape[0]
    prev = np.array([k])
    cur = np.array([k])
    score = np.array([0.0])
    history: list[tuple[np.ndarray, np.ndarray]] = []  # per step: (parent hypothesis, tag)
    tag_ids = np.arange(k)
    for t in range(n):
        trans = (log_trans[cur[:, None], tag_ids[None, :]] if order == 2
                 else log_trans[prev[:, None], cur[:, None], tag_ids[None, :]])
        cand = (score[:, None] + trans + em[t][None, :]).ravel()  # (h * K,)
        parent = np.repeat(np.arange(len(score)), k)
        new = np.tile(tag_ids, len(score))
        key = new if order == 2 else cur[parent] * (k + 1) + new
        rank = np.argsort(-cand, kind="stable")
        _, first = np.unique(key[rank], return_index=True)  # best hypothesis of each state
        keep = rank[first]
        keep = keep[np.argsort(-cand[keep], kind="stable")][:width]
        history.append((parent[keep], new[keep]))
        prev, cur, score = cur[parent[keep]], new[keep], cand[keep]
    end = log_trans[cur, k] if order == 2 else log_trans[prev, cur, k]
    h = int(np.argmax(score + end))
    path = []
    for parents, tags in reversed(history):
        path.append(int(tags[h]))
        h = int(parents[h])
    return path[::-1]

# ------------------------------------------------------------------ textbook MLE tables

