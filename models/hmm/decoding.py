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
  pair of states): O(n K beta), equal to Viterbi when beta is at least the number of states; batched.
- Exact Viterbi over every tag of finite emission score, and Viterbi of one sentence over any
  candidates: a compiled kernel (numba) per sentence (`viterbi_one`, `viterbi_many`), the state a pair
  of candidate slots, each step the sparse trigram step (the smallest over the tag two back, plus the
  listed trigrams). A sentence's lattice is small; numpy's per-call overhead dominated it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

NEG = -np.inf


class SparseTrigrams(NamedTuple):
    """log P(c | a, b) = base[b, c] except at the (a, b, c) listed per (a, b) row: (base, row pointers
    (row a * (K+1) + b), c of each entry, its log P). Interpolated trigrams differ from their smallest
    over a only where the trigram was observed, so the list is short."""

    base: np.ndarray
    ptr: np.ndarray
    cur: np.ndarray
    value: np.ndarray


def sparse_trigrams(log_trans: np.ndarray) -> SparseTrigrams:
    base = log_trans.min(axis=0)  # (K+1, K+1): over the tag two back
    a, b, c = np.nonzero(log_trans > base[None])
    ptr = np.searchsorted(a * len(log_trans) + b, np.arange(len(log_trans) ** 2 + 1))
    return SparseTrigrams(base, ptr, c, log_trans[a, b, c])


def token_candidates(em: np.ndarray, max_candidates: int,
                     prune: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidate tags of each token of em (N, K), best first: ids (N, m), scores (N, m), widths (N,)
    (how many are kept: possible, within `prune` of the best, at most max_candidates)."""
    n, k = em.shape
    m = min(max_candidates, k)
    if m >= k and prune is None and np.isfinite(em).all():
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
                   lengths: np.ndarray, tables: SparseTrigrams | None = None) -> list[list[int]]:
    """Trigram Viterbi over state pairs for many sentences at once, each position with its own number
    of candidate tags (no padding to a batch's widest): one step per position handles every sentence
    still running, as flat arrays of (sentence, prev2 slot, prev slot, cur slot) triples, or, with
    `tables` (`sparse_trigrams(log_trans)`), of (sentence, prev slot, cur slot) pairs plus the few
    triples whose trigram is not the smallest (`_sparse_step`): O(m^2 + observed trigrams) a step, not m^3.
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
    slot_of = None
    if tables is not None:  # slot_of[row, state]: the slot of that state among the row's candidates, or -1
        slot_of = np.full((n_ext, k1), -1, dtype=np.int16)
        row, slot = _segments(x_w)
        slot_of[row, x_ids[row, slot]] = slot
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
        if tables is not None:
            best, bp = _sparse_step(tables, x_ids, x_w, slot_of, ra, rb, rc, delta, d_off)
            g_sent, g_loc = _segments(b_w * c_w)
            delta = best + x_sc[rc[g_sent], g_loc % c_w[g_sent]]
            d_off = np.concatenate([[0], np.cumsum(b_w * c_w)])
            steps.append((bp, d_off, c_w))
            continue
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


def _segments(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For runs of the given lengths laid end to end: each element's run and its place within the run."""
    run = np.repeat(np.arange(len(counts)), counts)
    return run, np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _sparse_step(t: SparseTrigrams, x_ids: np.ndarray, x_w: np.ndarray, slot_of: np.ndarray, ra: np.ndarray,
                 rb: np.ndarray, rc: np.ndarray, delta: np.ndarray, d_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One trigram Viterbi step, exact: max_a delta[a, b] + log P(c | a, b) is the larger of
    (max_a delta[a, b]) + base[b, c] and the listed (a, b, c) with their own log P. Rows ra, rb, rc of the
    running sentences at p-2, p-1, p; delta over (slot p-2, slot p-1) pairs (p-2 major). Returns the best
    score and the slot at p-2 of each (sentence, slot p-1, slot p), p-1 major."""
    k1 = len(t.base)
    a_w, b_w, c_w = x_w[ra], x_w[rb], x_w[rc]
    # max and argmax over the slot at p-2 of each (sentence, slot at p-1)
    sent, loc = _segments(a_w * b_w)  # p-1 major
    i, j = loc % a_w[sent], loc // a_w[sent]
    d = delta[d_off[sent] + i * b_w[sent] + j]
    size = np.repeat(a_w, b_w)
    seg = np.cumsum(size) - size
    m = np.maximum.reduceat(d, seg)
    arg = np.minimum.reduceat(np.where(d == np.repeat(m, size), i, np.iinfo(np.int64).max), seg)
    m_off = np.cumsum(b_w) - b_w
    g_sent, g_loc = _segments(b_w * c_w)
    j, kk = g_loc // c_w[g_sent], g_loc % c_w[g_sent]
    pair = m_off[g_sent] + j
    best = m[pair] + t.base[x_ids[rb[g_sent], j], x_ids[rc[g_sent], kk]]
    bp = arg[pair]
    # the listed trigrams among the candidates
    sent, loc = _segments(a_w * b_w)  # p-2 major, as delta
    i, j = loc // b_w[sent], loc % b_w[sent]
    row = x_ids[ra[sent], i] * k1 + x_ids[rb[sent], j]
    e_pair, e_loc = _segments(t.ptr[row + 1] - t.ptr[row])
    entry = t.ptr[row[e_pair]] + e_loc
    e_sent = sent[e_pair]
    kk = slot_of[rc[e_sent], t.cur[entry]].astype(np.int64)
    hit = kk >= 0
    e_pair, entry, e_sent, kk = e_pair[hit], entry[hit], e_sent[hit], kk[hit]
    g_off = np.cumsum(b_w * c_w) - b_w * c_w
    g = g_off[e_sent] + j[e_pair] * c_w[e_sent] + kk
    val = delta[d_off[e_sent] + loc[e_pair]] + t.value[entry]
    np.maximum.at(best, g, val)
    won = val == best[g]
    bp[g[won]] = i[e_pair][won]
    return best, bp


class OneSentenceTables(NamedTuple):
    """What the per-call Viterbi reads, contiguous: log P(c | a, b) as `SparseTrigrams` (order 2: the
    bigram table as base, no entries) with each (a, b) row's largest listed value (`row_max`),
    log P(c | <s>, <s>) as `first` and log P(</s> | b, c) as `last`."""

    trigrams: SparseTrigrams
    row_max: np.ndarray
    first: np.ndarray
    last: np.ndarray


def one_sentence_tables(log_trans: np.ndarray, trigrams: SparseTrigrams | None = None) -> OneSentenceTables:
    k1 = len(log_trans)
    if log_trans.ndim == 3:
        t = trigrams or sparse_trigrams(log_trans)
        row_max = np.full(k1 * k1, NEG)
        np.maximum.at(row_max, np.repeat(np.arange(k1 * k1), np.diff(t.ptr)), t.value)
        return OneSentenceTables(t, row_max, np.ascontiguousarray(log_trans[k1 - 1, k1 - 1]),
                                 np.ascontiguousarray(log_trans[:, :, k1 - 1]))
    none = SparseTrigrams(np.ascontiguousarray(log_trans), np.zeros(k1 * k1 + 1, dtype=np.int64),
                          np.zeros(0, dtype=np.int64), np.zeros(0))
    return OneSentenceTables(none, np.full(k1 * k1, NEG), np.ascontiguousarray(log_trans[k1 - 1]),
                             np.ascontiguousarray(np.broadcast_to(log_trans[:, k1 - 1], (k1, k1))))


def viterbi_one(tables: OneSentenceTables, ids: list[np.ndarray], sc: list[np.ndarray]) -> list[int]:
    """Viterbi of one sentence over its tokens' candidates (states ids[t], scores sc[t]): the per-call
    path, compiled (`_viterbi_kernel`). Exact over the candidates given: with every tag of finite
    emission score as a candidate it is the exact Viterbi."""
    if not ids:
        return []
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in ids], out=offsets[1:])
    t = tables.trigrams
    return _viterbi_kernel(t.base, t.ptr, t.cur, t.value, tables.row_max, tables.first, tables.last,
                           np.concatenate(ids).astype(np.int64, copy=False),
                           np.concatenate(sc).astype(np.float64, copy=False), offsets).tolist()


def viterbi_many(tables: OneSentenceTables, ids: np.ndarray, sc: np.ndarray, wid: np.ndarray,
                 lengths: np.ndarray) -> list[list[int]]:
    """`viterbi_one` of non-empty sentences laid end to end: token t's candidates are ids[t, :wid[t]]
    with scores sc[t, :wid[t]]."""
    keep = np.arange(ids.shape[1])[None, :] < wid[:, None]
    flat_ids, flat_sc = ids[keep].astype(np.int64), sc[keep].astype(np.float64)
    cand_at = np.zeros(len(wid) + 1, dtype=np.int64)
    np.cumsum(wid, out=cand_at[1:])
    t = tables.trigrams
    out, start = [], 0
    for n in np.asarray(lengths).tolist():
        lo, hi = cand_at[start], cand_at[start + n]
        out.append(_viterbi_kernel(t.base, t.ptr, t.cur, t.value, tables.row_max, tables.first, tables.last,
                                   flat_ids[lo:hi], flat_sc[lo:hi], cand_at[start:start + n + 1] - lo).tolist())
        start += n
    return out


@njit(cache=True, nogil=True)
def _viterbi_kernel(base, ptr, cur, value, row_max, first, last, ids, sc, offsets):  # pragma: no cover  (compiled)
    """Max-product over one sentence's candidates. The state at token t is the pair (slot at t-1, slot
    at t); the token before the first is <s> (id K) with one slot. A step is the sparse trigram step:
    (best over the slot two back) + base[b, c], then the listed trigrams (a, b, c) among the candidates,
    skipping a row none of whose entries can beat the lowest cell (exact: nothing it holds could win)."""
    k1 = base.shape[0]
    n = len(offsets) - 1
    pair_at = np.zeros(n + 1, dtype=np.int64)  # offsets of each token's (prev slot, slot) block
    prev_m = 1
    for t in range(n):
        pair_at[t + 1] = pair_at[t] + prev_m * (offsets[t + 1] - offsets[t])
        prev_m = offsets[t + 1] - offsets[t]
    delta = np.full(pair_at[n], -np.inf)
    back = np.zeros(pair_at[n], dtype=np.int64)  # per pair: the best slot two tokens back
    slot_of = np.full(k1, -1, dtype=np.int64)
    for c in range(offsets[1]):
        delta[c] = first[ids[c]] + sc[c]
    for t in range(1, n):
        c0, m = offsets[t], offsets[t + 1] - offsets[t]
        b0, mb = offsets[t - 1], offsets[t] - offsets[t - 1]
        a0, ma = (offsets[t - 2], offsets[t - 1] - offsets[t - 2]) if t >= 2 else (-1, 1)
        here, before = pair_at[t], pair_at[t - 1]
        for c in range(m):
            slot_of[ids[c0 + c]] = c
        for j in range(mb):
            b_id = ids[b0 + j]
            top, arg = -np.inf, 0
            for i in range(ma):
                if delta[before + i * mb + j] > top:
                    top, arg = delta[before + i * mb + j], i
            cell = here + j * m
            floor = np.inf
            for c in range(m):
                delta[cell + c] = top + base[b_id, ids[c0 + c]]
                back[cell + c] = arg
                floor = min(floor, delta[cell + c])
            for i in range(ma):
                d = delta[before + i * mb + j]
                row = (k1 - 1 if a0 < 0 else ids[a0 + i]) * k1 + b_id
                if d == -np.inf or d + row_max[row] <= floor:
                    continue
                for e in range(ptr[row], ptr[row + 1]):
                    c = slot_of[cur[e]]
                    if c >= 0 and d + value[e] > delta[cell + c]:
                        delta[cell + c] = d + value[e]
                        back[cell + c] = i
            for c in range(m):
                delta[cell + c] += sc[c0 + c]
        for c in range(m):
            slot_of[ids[c0 + c]] = -1
    # </s> after the last two states
    c0, m = offsets[n - 1], offsets[n] - offsets[n - 1]
    mb = 1 if n == 1 else offsets[n - 1] - offsets[n - 2]
    top, bj, bc = -np.inf, 0, 0
    for j in range(mb):
        b_id = k1 - 1 if n == 1 else ids[offsets[n - 2] + j]
        for c in range(m):
            v = delta[pair_at[n - 1] + j * m + c] + last[b_id, ids[c0 + c]]
            if v > top:
                top, bj, bc = v, j, c
    path = np.empty(n, dtype=np.int64)
    j, c = bj, bc
    for t in range(n - 1, 0, -1):
        path[t] = ids[offsets[t] + c]
        j, c = back[pair_at[t] + j * (offsets[t + 1] - offsets[t]) + c], j  # one token back
    path[0] = ids[c]
    return path


def beam_batch(log_trans: np.ndarray, em: np.ndarray, width: int) -> np.ndarray:
    """Beam search of `width` over a batch of equal-length sentences, em (B, n, K): each step extends every
    hypothesis by every tag, keeps the best path into each state (order 3: each pair of states), then the
    `width` best states. Same search as `beam`, batched; ties may break differently. Returns (B, n)."""
    k = len(log_trans) - 1
    order = log_trans.ndim
    bsz, n, _ = em.shape
    rows = np.arange(bsz)[:, None]
    prev = np.full((bsz, width), k)
    cur = np.full((bsz, width), k)
    score = np.full((bsz, width), NEG)
    score[:, 0] = 0.0  # one hypothesis, <s>, to start
    parents, tags = [], []
    for t in range(n):
        trans = log_trans[cur, :k] if order == 2 else log_trans[prev, cur, :k]  # (B, w, K)
        cand = score[:, :, None] + trans + em[:, t, None, :]
        if order == 2:  # recombine: the best hypothesis into each tag
            parent = cand.argmax(axis=1)  # (B, K)
            best = np.take_along_axis(cand, parent[:, None, :], axis=1)[:, 0, :]
            keep = np.argpartition(-best, width - 1, axis=1)[:, :width] if width < k else np.broadcast_to(
                np.arange(k), (bsz, k))
            new_score = np.take_along_axis(best, keep, axis=1)
            new_parent, new_tag = np.take_along_axis(parent, keep, axis=1), keep
        else:  # recombine hypotheses with the same current state: (cur, tag) is the new pair
            same = (cur[:, :, None] == cur[:, None, :]) & (np.arange(width)[:, None] != np.arange(width)[None, :])
            better = (cand[:, None, :, :] > cand[:, :, None, :]) | (
                (cand[:, None, :, :] == cand[:, :, None, :]) & (np.arange(width)[None, :] < np.arange(width)[:, None])
                [None, :, :, None])  # [b, h, h2, tag]: h2 beats h into the same pair
            dominated = np.any(same[:, :, :, None] & better, axis=2)
            cand = np.where(dominated, NEG, cand).reshape(bsz, -1)
            m = min(width, cand.shape[1])
            keep = np.argpartition(-cand, m - 1, axis=1)[:, :m]
            new_score = np.take_along_axis(cand, keep, axis=1)
            new_parent, new_tag = keep // k, keep % k
        rank = np.argsort(-new_score, axis=1, kind="stable")
        new_score = np.take_along_axis(new_score, rank, axis=1)
        new_parent = np.take_along_axis(new_parent, rank, axis=1)
        new_tag = np.take_along_axis(new_tag, rank, axis=1)
        if new_score.shape[1] < width:  # fewer states than the width (order 2, width > K)
            pad = width - new_score.shape[1]
            new_score = np.pad(new_score, ((0, 0), (0, pad)), constant_values=NEG)
            new_parent, new_tag = np.pad(new_parent, ((0, 0), (0, pad))), np.pad(new_tag, ((0, 0), (0, pad)))
        parents.append(new_parent)
        tags.append(new_tag)
        prev, cur, score = cur[rows, new_parent], new_tag, new_score
    end = log_trans[cur, k] if order == 2 else log_trans[prev, cur, k]
    h = np.argmax(score + end, axis=1)
    out = np.empty((bsz, n), dtype=np.int64)
    for t in range(n - 1, -1, -1):
        out[:, t] = tags[t][rows[:, 0], h]
        h = parents[t][rows[:, 0], h]
    return out
