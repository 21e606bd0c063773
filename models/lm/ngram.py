"""Count-based n-gram language models: MLE, add-k (Laplace/Lidstone) and interpolated Kneser–Ney.

References:
- Kneser & Ney (1995), "Improved backing-off for m-gram language modeling" (continuation counts).
- Chen & Goodman (1998), "An empirical study of smoothing techniques for language modeling",
  TR-10-98: interpolated KN (eq. 17) and modified KN with three discounts D1, D2, D3+ (eq. 26).
- Ney, Essen & Kneser (1994): the discount estimate Y = n1 / (n1 + 2 n2).

Conventions (shared with the neural LMs in this package):
- A corpus is a sequence of sentences, each a 1-D int array of token ids without boundary tokens.
- Every sentence is padded as ``<s>`` * (order - 1) + tokens + ``</s>`` (one ``</s>``). The model
  predicts every token and the final ``</s>``; ``<s>`` and ``<pad>`` are never predicted (their
  probability is 0). A sentence of L tokens therefore contributes L + 1 predictions to training and
  to perplexity: ``perplexity = exp(-sum(log p) / sum(L_i + 1))``. Out-of-vocabulary tokens count as
  ``<unk>`` predictions.
- Training n-grams are all k-grams (k = 1..order) of the padded sentence that end on a predicted
  token. That is NLTK's ``everygrams`` of the padded sentence minus those ending in ``<s>``
  (NLTK's ``padded_everygram_pipeline`` also pads ``</s>`` order-1 times and thereby makes ``<s>`` and
  ``</s>`` predictable inside the padding); with this input NLTK's ``KneserNeyInterpolated`` gives
  exactly our probabilities for ``smoothing="kneser_ney"`` with a fixed ``discount`` (tested).
- ``<unk>`` handling: token ids seen fewer than ``min_count`` times in training, never seen, or
  outside ``[0, vocab_size)`` are mapped to ``unk_id`` in training, in contexts and in scoring (as
  NLTK's ``Vocabulary(unk_cutoff=min_count)``). ``log_probs`` gives them probability 0 and puts their
  mass on ``unk_id``. Under Kneser–Ney, ``<unk>`` has probability 0 if it never occurs in training
  (as in NLTK); ``min_count >= 2`` or a corpus containing ``<unk>`` avoids that.

Counting is vectorised (numpy): contexts get dense ids level by level, nearest token first
(``key = parent_context_id * V + token``, unique-d with ``np.unique``), so a k-gram is the int64 key
``context_id * V + word`` whatever the order, with no overflow for any realistic V. Counts of order
k < n are derived from the unique (k+1)-grams: raw counts by summing, KN continuation counts
N1+(• context word) by counting distinct left extensions. Queries are binary searches in sorted keys,
vectorised over the vocabulary (``log_probs``) or over all held-out positions (``perplexity``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import polars as pl
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.progress import Progress
from pydantic import Field

logger = logging.getLogger("lexiflow.ngram")

SMOOTHINGS = ("mle", "add_k", "kneser_ney")
FORMAT = "lexiflow.ngram"
FORMAT_VERSION = 1
_MAX_KEY = np.iinfo(np.int64).max
# Queries above this many are sorted before the binary searches: in query order each search misses the cache
_SORT_QUERIES = 1 << 16


def _find(keys: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Index of each query in the sorted unique `keys`, or -1 where absent (negative queries are absent)."""
    if len(keys) == 0:
        return np.full(query.shape, -1, dtype=np.int64)
    if query.size > _SORT_QUERIES:  # searched in sorted order: 3.5 s -> 0.4 s for 3 M queries in 12 M keys
        flat = query.reshape(-1)
        order = np.argsort(flat)  # not stable: equal queries find the same place; the SIMD sort is 3x faster
        pos = np.empty(flat.shape, dtype=np.int64)
        pos[order] = np.searchsorted(keys, flat[order])
        pos = pos.reshape(query.shape)
    else:
        pos = np.searchsorted(keys, query)
    pos_c = np.minimum(pos, len(keys) - 1)
    hit = (keys[pos_c] == query) & (query >= 0)
    return np.where(hit, pos_c, -1)


def sentence_arrays(ids: pl.Series) -> list[np.ndarray]:
    """Lists of token ids (a tokenized corpus's `ids`) as the sentences the models take: 1-D int64 arrays."""
    flat = ids.explode().drop_nulls().to_numpy().astype(np.int64)
    lengths = ids.list.len().to_numpy()
    ends = np.cumsum(lengths)
    # slices, not np.split: its per-piece bookkeeping took 10 s for the 2.5 M sentences of 300 MB of text
    return [flat[a:b] for a, b in zip((ends - lengths).tolist(), ends.tolist(), strict=True)]


class NgramLM(Estimator):
    """An n-gram language model over token ids ``0..vocab_size-1``.

    Parameters
    ----------
    order: n, the number of tokens of an n-gram (context of n-1 tokens).
    smoothing: ``"kneser_ney"`` (interpolated KN, Chen & Goodman eq. 17; modified KN when
        ``discount`` is 0), ``"add_k"`` (Lidstone; k=1 is Laplace) or ``"mle"``.
    discount: Kneser–Ney only. A float in (0, 1]: one absolute discount for every order and count,
        as NLTK's ``KneserNeyInterpolated(order, discount)``. 0 (or None): modified KN, three discounts per
        order estimated from the count-of-counts (Chen & Goodman eq. 26).
    k: add-k only, the pseudo-count added to every (context, word) pair.
    min_count: training tokens seen fewer times become ``<unk>`` (NLTK's ``unk_cutoff``).
    vocab_size: V; None takes max id + 1 of the training corpus (at least 4).
    unk_id, bos_id, eos_id, pad_id: the special ids.

    Probabilities: with ``c`` the count of (context, word) at order k (raw count at the highest
    order, continuation count N1+(• context word) below it, Kneser–Ney),
    ``p_k(w | ctx) = (max(c - D(c), 0) + gamma(ctx) * p_{k-1}(w | ctx[1:])) / sum_w c`` where
    ``gamma(ctx)`` is the mass the discounts removed; the unigram level is
    ``N1+(• w) / N1+(• •)`` (no discount, as NLTK). A context never seen in training falls back to
    its shorter suffix (NLTK: alpha = 0, gamma = 1). MLE uses the longest context seen in training;
    add-k only the full context: ``(c + k) / (c(ctx) + k |W|)`` with W the words the model can predict.
    """

    def __init__(
        self,
        order: Annotated[int, Field(ge=1, le=8, description="n of the n-gram model.")] = 3,
        smoothing: Annotated[Literal["kneser_ney", "add_k", "mle"], Field(description="Estimator.")] = "kneser_ney",
        discount: Annotated[float, Field(ge=0, le=1, description="Kneser–Ney discount; 0 = modified KN (three "
                                                                 "discounts per order, estimated).")] = 0.0,
        k: Annotated[float, Field(gt=0, description="add-k smoothing constant.")] = 1.0,
        min_count: Annotated[int, Field(ge=1, description="Tokens seen fewer times in training count as <unk>, "
                                                          "so <unk> has probability mass for unseen held-out "
                                                          "tokens.")] = 2,
        vocab_size: int | None = None,
        unk_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
        pad_id: int = 3,
    ) -> None:
        self.order = order
        self.smoothing = smoothing
        self.discount = discount
        self.k = k
        self.min_count = min_count
        self.vocab_size = vocab_size
        self.unk_id = unk_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.pad_id = pad_id
        self._check_params()

    # ------------------------------------------------------------------ parameters
    def _check_params(self) -> None:
        if not isinstance(self.order, int | np.integer) or self.order < 1:
            raise ParameterError(f"order={self.order!r}: must be an integer >= 1 (3 for a trigram model)")
        if self.smoothing not in SMOOTHINGS:
            raise ParameterError(f"smoothing={self.smoothing!r}: choose one of {', '.join(SMOOTHINGS)}")
        if self.smoothing == "kneser_ney" and self.order < 2:
            raise ParameterError("order=1 with smoothing='kneser_ney': Kneser-Ney needs order >= 2")
        if self.discount and not 0.0 < float(self.discount) <= 1.0:
            raise ParameterError(f"discount={self.discount!r}: must be in (0, 1], or 0 for modified KN")
        if not float(self.k) > 0.0:
            raise ParameterError(f"k={self.k!r}: the add-k pseudo-count must be > 0")
        if not isinstance(self.min_count, int | np.integer) or self.min_count < 1:
            raise ParameterError(f"min_count={self.min_count!r}: must be an integer >= 1")
        specials = {"unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id}
        if len(set(specials.values())) != 4 or min(specials.values()) < 0:
            raise ParameterError(f"special ids {specials}: must be four distinct non-negative ids")
        if self.vocab_size is not None and self.vocab_size <= max(specials.values()):
            raise ParameterError(f"vocab_size={self.vocab_size}: must exceed every special id {specials}")

    # ------------------------------------------------------------------ data preparation
    def _concat(self, sentences: Sequence[np.ndarray], what: str) -> tuple[np.ndarray, np.ndarray]:
        """All tokens concatenated (int64) and the sentence lengths; checks ids."""
        if isinstance(sentences, np.ndarray) and sentences.ndim == 1 and sentences.dtype != object:
            raise InputError(f"{what}: expected a sequence of sentences (1-D id arrays), got one flat array")
        arrays = [np.asarray(s) for s in sentences]
        if not arrays:
            raise InputError(f"{what}: the corpus is empty; give at least one sentence")
        # one check per distinct (ndim, dtype) of the non-empty sentences, not per sentence (0.7 s of 250 k)
        if any(ndim != 1 or not np.issubdtype(dtype, np.integer)
               for ndim, dtype in {(a.ndim, a.dtype) for a in arrays if a.ndim != 1 or a.size}):
            i, a = next((i, a) for i, a in enumerate(arrays)
                        if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)))
            raise InputError(f"{what}: sentence {i} must be a 1-D integer array of token ids, "
                             f"got shape {a.shape} dtype {a.dtype}")
        lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        tokens = np.concatenate(arrays).astype(np.int64, copy=False) if lengths.sum() else np.zeros(0, np.int64)
        if tokens.size and tokens.min() < 0:
            raise InputError(f"{what}: negative token id {tokens.min()}; ids must be in [0, vocab_size)")
        bad = np.isin(tokens, [self.bos_id, self.eos_id, self.pad_id])
        if bad.any():
            raise InputError(f"{what}: sentences contain boundary/padding id {tokens[bad][0]}; give sentences "
                             f"without <s>, </s> or <pad> (the model adds the boundaries itself)")
        return tokens, lengths

    def _ngram_matrix(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(M, order) int64: for each predicted position (tokens and one </s> per sentence) its
        order-1 context (oldest first, <s>-padded) and the word in the last column."""
        n = self.order
        S = len(lengths)
        sent_len = lengths + n  # (n-1) <s> + tokens + </s>
        start = np.zeros(S, dtype=np.int64)
        np.cumsum(sent_len[:-1], out=start[1:])
        stream = np.full(int(sent_len.sum()), self.bos_id, dtype=np.int64)
        tok_start = np.zeros(S, dtype=np.int64)
        np.cumsum(lengths[:-1], out=tok_start[1:])
        # stream position of token j of sentence i: start_i + n-1 + j
        tok_pos = np.repeat(start + n - 1 - tok_start, lengths) + np.arange(tokens.size)
        stream[tok_pos] = tokens
        stream[start + n - 1 + lengths] = self.eos_id
        pred_len = lengths + 1
        pred_start = np.zeros(S, dtype=np.int64)
        np.cumsum(pred_len[:-1], out=pred_start[1:])
        pred_pos = np.repeat(start + n - 1 - pred_start, pred_len) + np.arange(int(pred_len.sum()))
        return stream[pred_pos[:, None] + np.arange(-(n - 1), 1)]

    def _map_ids(self, ids: np.ndarray) -> np.ndarray:
        """Map ids outside the model vocabulary (rare, unseen, out of range) to unk_id."""
        ids = np.asarray(ids, dtype=np.int64)
        V = self.vocab_size_
        inside = (ids >= 0) & (ids < V)
        known = np.zeros(ids.shape, dtype=bool)
        known[inside] = self.known_[ids[inside]]
        return np.where(known, ids, self.unk_id)

    # ------------------------------------------------------------------ fitting
    def fit(self, sentences: Sequence[np.ndarray]) -> NgramLM:
        """Count the n-grams of `sentences` (each a 1-D array of ids, no boundary tokens)."""
        rows = self.ngram_rows(sentences, "fit(sentences)")
        return self.fit_counts(rows, np.ones(len(rows), dtype=np.int64))

    def ngram_rows(self, sentences: Sequence[np.ndarray], what: str = "sentences") -> np.ndarray:
        """(M, order) int64: the padded n-grams of `sentences` (`_ngram_matrix`), ids as given (not mapped to
        <unk>): what `fit_counts` counts."""
        self._check_params()
        return self._ngram_matrix(*self._concat(sentences, what))

    def fit_counts(self, rows: np.ndarray, counts: np.ndarray) -> NgramLM:
        """`fit` from counted n-grams: `rows` (M, order) padded n-grams as `ngram_rows` gives them, each seen
        `counts` times (rows may repeat: their counts add). Counts of the rows of any split of a corpus add up
        to the corpus's, and the model depends on nothing else: fit from their sum, it is the model `fit` makes
        of the whole corpus (the unigram counts that decide `<unk>` are the counts of the rows' last column)."""
        self._check_params()
        rows, counts = np.asarray(rows, dtype=np.int64).reshape(-1, self.order), np.asarray(counts, dtype=np.int64)
        if not len(rows):
            raise InputError("fit: the corpus is empty; give at least one sentence")
        words = rows[:, -1]
        is_token = words != self.eos_id  # each sentence's last prediction is its </s>
        tokens, weights = words[is_token], counts[is_token]
        specials = max(self.unk_id, self.bos_id, self.eos_id, self.pad_id)
        V = self.vocab_size if self.vocab_size is not None else max(int(tokens.max(initial=0)), specials) + 1
        with Progress("ngram.fit", total=float(counts.sum()), unit="tokens") as progress:
            in_range = tokens < V
            unigram = np.bincount(tokens[in_range], weights=weights[in_range], minlength=V)
            known = unigram >= self.min_count
            known[[self.unk_id, self.bos_id, self.eos_id]] = True
            known[self.pad_id] = False
            self.vocab_size_ = V
            self.known_ = known
            self._build(self._map_ids(rows), counts)
            progress.update(float(counts.sum()))
        return self

    def _build(self, rows: np.ndarray, weights: np.ndarray) -> None:
        """All learned tables from unique-or-not n-gram rows (M, n) with counts `weights` (M,)."""
        n, V = self.order, self.vocab_size_
        if len(rows) and (len(rows) + 1) * V >= _MAX_KEY:
            raise ParameterError(f"vocab_size={V} with {len(rows)} n-grams overflows int64 keys; lower vocab_size")
        # context ids, level m = context of the m nearest tokens; level 0 is the empty context (id 0)
        ctx = np.zeros(len(rows), dtype=np.int64)
        ctx_keys: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
        for m in range(1, n):
            uniq, ctx = np.unique(ctx * V + rows[:, n - 1 - m], return_inverse=True)
            ctx_keys.append(uniq)
            ctx = ctx.reshape(-1)
        # highest order: raw counts
        keys, inv = np.unique(ctx * V + rows[:, n - 1], return_inverse=True)
        ngram_keys: dict[int, np.ndarray] = {n: keys}
        raw: dict[int, np.ndarray] = {n: np.bincount(inv.reshape(-1), weights=weights, minlength=len(keys))}
        cont: dict[int, np.ndarray] = {}
        # lower orders from the unique (k+1)-grams: drop the oldest context token
        for k in range(n - 1, 0, -1):
            hi = ngram_keys[k + 1]
            parent = ctx_keys[k][hi // V] // V  # context id at level k-1
            keys, inv = np.unique(parent * V + hi % V, return_inverse=True)
            inv = inv.reshape(-1)
            ngram_keys[k] = keys
            raw[k] = np.bincount(inv, weights=raw[k + 1], minlength=len(keys))
            cont[k] = np.bincount(inv, minlength=len(keys)).astype(np.float64)
        self.ctx_keys_ = ctx_keys
        self.ngram_keys_ = ngram_keys
        self.counts_ = raw  # float64 holding exact integers
        self.continuation_counts_ = cont
        self._derive()

    def _derive(self) -> None:
        """Per-order discounts, the numerators and per-context totals the estimators use."""
        n, V = self.order, self.vocab_size_
        self.discounts_: dict[int, tuple[float, float, float]] = {}
        self._num: dict[int, np.ndarray] = {}  # alpha numerators per n-gram
        self._total: dict[int, np.ndarray] = {}  # per context: sum of the counts of this order
        self._gamma: dict[int, np.ndarray] = {}  # per context: discounted mass
        for k in range(1, n + 1):
            kn = self.smoothing == "kneser_ney"
            c = self.counts_[k] if (k == n or not kn) else self.continuation_counts_[k]
            n_ctx = len(self.ctx_keys_[k - 1])
            ctx_of = self.ngram_keys_[k] // V
            if kn and k > 1:
                d = self._estimate_discounts(c) if not self.discount else (float(self.discount),) * 3
                removed = np.minimum(c, np.choose(np.minimum(c, 3).astype(np.int64) - 1, d))
            else:
                d, removed = (0.0, 0.0, 0.0), np.zeros_like(c)
            self.discounts_[k] = tuple(float(x) for x in d)
            self._num[k] = c - removed
            self._total[k] = np.bincount(ctx_of, weights=c, minlength=n_ctx)
            self._gamma[k] = np.bincount(ctx_of, weights=removed, minlength=n_ctx)
        self._predictable = self.known_.copy()
        self._predictable[[self.bos_id, self.pad_id]] = False
        unk_seen = _find(self.ngram_keys_[1], np.array([self.unk_id]))[0] >= 0
        if self.smoothing == "kneser_ney" and not unk_seen:
            logger.warning("ngram: <unk> (id %d) never occurs in training, so it has probability 0 and any "
                           "out-of-vocabulary held-out token gives infinite perplexity; use min_count >= 2",
                           self.unk_id)

    @staticmethod
    def _estimate_discounts(c: np.ndarray) -> tuple[float, float, float]:
        """Modified-KN discounts D1, D2, D3+ from the count-of-counts (Chen & Goodman 1998, eq. 26)."""
        n1, n2, n3, n4 = (float(x) for x in np.bincount(c.astype(np.int64), minlength=5)[1:5])
        y = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.5
        out = []
        for i, (ni, nj) in enumerate(((n1, n2), (n2, n3), (n3, n4)), start=1):
            di = i - (i + 1) * y * nj / ni if ni > 0 else y
            # small corpora can give a discount outside (0, i]: fall back to the plain KN estimate
            out.append(di if 0 < di <= i else min(max(y, 1e-3), 1.0))
        return out[0], out[1], out[2]

    # ------------------------------------------------------------------ querying
    def _context_ids(self, contexts: np.ndarray) -> list[np.ndarray]:
        """Context id per level m = 0..n-1 for each row of `contexts` (P, n-1), -1 where unseen."""
        n, V = self.order, self.vocab_size_
        ids = [np.zeros(len(contexts), dtype=np.int64)]
        for m in range(1, n):
            prev = ids[-1]
            q = np.where(prev >= 0, prev * V + contexts[:, n - 1 - m], -1)
            ids.append(_find(self.ctx_keys_[m], q))
        return ids

    def _probs(self, ctx_ids: list[np.ndarray], words: np.ndarray) -> np.ndarray:
        """p(word | context) for P positions: ctx_ids per level (P,), words (P,) in [0, V) (a word the model
        never predicts, e.g. one mapped to <unk> in training, gets 0)."""
        n, V = self.order, self.vocab_size_
        if self.smoothing == "add_k":
            c = ctx_ids[n - 1]
            idx = _find(self.ngram_keys_[n], np.where(c >= 0, c * V + words, -1))
            num = np.where(idx >= 0, self._num[n][idx], 0.0) + self.k
            den = np.where(c >= 0, self._total[n][np.maximum(c, 0)], 0.0) + self.k * self._predictable.sum()
            return np.where(self._predictable[words], num / den, 0.0)
        p = np.zeros(len(words))
        for k in range(1, n + 1):
            c = ctx_ids[k - 1]
            seen = c >= 0
            cs = np.maximum(c, 0)
            idx = _find(self.ngram_keys_[k], np.where(seen, c * V + words, -1))
            num = np.where(idx >= 0, self._num[k][np.maximum(idx, 0)], 0.0)
            if self.smoothing == "mle":
                p = np.where(seen, num / np.where(seen, self._total[k][cs], 1.0), p)  # longest seen context
            else:  # Kneser–Ney: interpolate with the order below (k = 1: gamma = 0)
                p = np.where(seen, (num + self._gamma[k][cs] * p) / np.where(seen, self._total[k][cs], 1.0), p)
        return p

    def _prepare_context(self, context: Sequence[int]) -> np.ndarray:
        """The last order-1 ids of <s>-padded `context` (leading <s> ids optional), mapped."""
        ctx = np.asarray(context, dtype=np.int64).reshape(-1)
        ctx = ctx[np.argmax(ctx != self.bos_id):] if (ctx != self.bos_id).any() else ctx[:0]
        ctx = self._map_ids(ctx)
        padded = np.concatenate([np.full(self.order - 1, self.bos_id, dtype=np.int64), ctx])
        return padded[len(padded) - (self.order - 1):]

    def _dense(self, k: int, c: np.ndarray) -> np.ndarray:
        """(B, V): the alpha numerators of order k for seen context ids `c` (B,), scattered over the
        vocabulary (a context's k-grams are one sorted run of keys, c * V .. (c + 1) * V)."""
        V, keys = self.vocab_size_, self.ngram_keys_[k]
        lo = np.searchsorted(keys, c * V)
        runs = np.searchsorted(keys, (c + 1) * V) - lo
        idx = np.arange(int(runs.sum())) + np.repeat(lo - (np.cumsum(runs) - runs), runs)
        out = np.zeros((len(c), V))
        # row b's cell for key c_b * V + w is b * V + w: flat index = key + (b - c_b) * V
        out.reshape(-1)[keys[idx] + np.repeat((np.arange(len(c)) - c) * V, runs)] = self._num[k][idx]
        return out

    def log_probs_batch(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """(B, V) natural-log next-token distributions, one per context (ids, conventionally starting
        with `<s>`; a context shorter than order-1 is sentence-initial). -inf where the probability is 0.
        The estimators of `_probs` (perplexity's scorer), for whole distributions: each context's seen
        k-grams are read as one run of sorted keys instead of V binary searches."""
        self._check_fitted()
        n, V = self.order, self.vocab_size_
        if not len(contexts):
            return np.zeros((0, V))
        ids = self._context_ids(np.stack([self._prepare_context(c) for c in contexts]))  # per level, (B,)
        p = np.zeros((len(contexts), V))
        if self.smoothing == "add_k":
            seen = np.flatnonzero(ids[n - 1] >= 0)
            c = ids[n - 1][seen]
            p[seen] = self._dense(n, c)
            p += self.k
            p[seen] /= (self._total[n][c] + self.k * self._predictable.sum())[:, None]
            p[np.flatnonzero(ids[n - 1] < 0)] /= self.k * self._predictable.sum()
            p[:, ~self._predictable] = 0.0
        else:
            for k in range(1, n + 1):
                seen = np.flatnonzero(ids[k - 1] >= 0)  # an unseen context keeps the shorter one's distribution
                c = ids[k - 1][seen]
                num = self._dense(k, c)
                if self.smoothing == "kneser_ney":
                    num += self._gamma[k][c][:, None] * p[seen]
                p[seen] = num / self._total[k][c][:, None]
        with np.errstate(divide="ignore"):
            return np.log(p)

    def log_probs(self, context: Sequence[int]) -> np.ndarray:
        """(V,) `log_probs_batch` of one context."""
        return self.log_probs_batch([context])[0]

    def token_log_probs(self, sentences: Sequence[np.ndarray]) -> np.ndarray:
        """Natural-log probability of every predicted position (each token, then </s>), concatenated."""
        self._check_fitted()
        tokens, lengths = self._concat(sentences, "sentences")
        rows = self._ngram_matrix(self._map_ids(tokens), lengths)
        p = self._probs(self._context_ids(rows[:, :-1]), rows[:, -1])
        with np.errstate(divide="ignore"):
            return np.log(p)

    def perplexity(self, sentences: Sequence[np.ndarray], progress: Callable[[float | None], None] | None = None
                   ) -> float:
        """exp(-mean log p) over all predicted positions: sum(len(s) + 1) of them (tokens and </s>;
        out-of-vocabulary tokens are scored as <unk>; <s> padding is never scored). One vectorized pass
        (seconds): `progress(fraction)` hears only its end."""
        ppl = float(np.exp(-self.token_log_probs(sentences).mean()))
        if progress is not None:
            progress(1.0)
        return ppl

    # ------------------------------------------------------------------ tables and persistence
    def ngram_table(self, k: int) -> pl.DataFrame:
        """Order-k n-grams as a table: columns w1..wk (token ids, oldest first), `count` (raw count)
        and, below the highest order, `continuation` (N1+(• w1..wk), distinct left extensions)."""
        self._check_fitted()
        if not 1 <= k <= self.order:
            raise ParameterError(f"k={k}: an order between 1 and {self.order}")
        V = self.vocab_size_
        keys = self.ngram_keys_[k]
        cols: dict[str, np.ndarray] = {f"w{k}": keys % V}
        c = keys // V
        for m in range(k - 1, 0, -1):  # the token at distance m from the word is the oldest of the m-context
            ck = self.ctx_keys_[m][c]
            cols[f"w{k - m}"] = ck % V
            c = ck // V
        data = {f"w{i}": cols[f"w{i}"].astype(np.uint32) for i in range(1, k + 1)}
        data["count"] = self.counts_[k].astype(np.int64)
        if k < self.order:
            data["continuation"] = self.continuation_counts_[k].astype(np.int64)
        return pl.DataFrame(data)

    def to_arpa(self, path: str | Path, tokens: Sequence[str]) -> None:
        """Write the model as an ARPA back-off file (SRILM/KenLM), `tokens[id]` the string of each id
        (`<s>`, `</s>`, `<unk>` for the special ids, as KenLM expects). Interpolated Kneser–Ney in back-off
        form: each stored n-gram's log10 P is the interpolated probability, and each context's log10
        back-off weight is gamma(ctx) / total(ctx), the factor an unseen word's lower-order probability
        gets; so a back-off reader gives exactly `log_probs` (context padded with order-1 `<s>`, which the
        file holds as the context-only entries `<s>`, `<s> <s>`, ... with log10 P = -99)."""
        self._check_fitted()
        if self.smoothing != "kneser_ney":
            raise ParameterError(f"to_arpa: smoothing={self.smoothing!r}; ARPA export is for kneser_ney models")
        if len(tokens) < self.vocab_size_:
            raise ParameterError(f"to_arpa: {len(tokens)} token strings for a vocabulary of {self.vocab_size_}")
        n = self.order
        lines_by_order: list[list[str]] = []
        for k in range(1, n + 1):
            table = self.ngram_table(k)
            grams = np.stack([table[f"w{i}"].to_numpy().astype(np.int64) for i in range(1, k + 1)], axis=1)
            bos_only = np.full((1, k), self.bos_id) if k < n else np.zeros((0, k), dtype=np.int64)
            grams = np.concatenate([grams, bos_only])  # the context <s>^k: no probability, a back-off weight
            with np.errstate(divide="ignore"):
                logp = np.log10(self._probs(self._levels(grams[:, :-1], k - 1), grams[:, -1]))
            logp[len(grams) - len(bos_only):] = -99.0
            lines = [" ".join(tokens[i] for i in row) for row in grams.tolist()]
            if k < n:
                c = self._levels(grams, k)[k]
                with np.errstate(divide="ignore"):
                    bow = np.where(c >= 0, np.log10(self._gamma[k + 1][np.maximum(c, 0)]
                                                    / self._total[k + 1][np.maximum(c, 0)]), 0.0)
                lines = [f"{p:.7g}\t{g}\t{b:.7g}" if b else f"{p:.7g}\t{g}" for p, g, b in zip(logp, lines, bow,
                                                                                           strict=True)]
            else:
                lines = [f"{p:.7g}\t{g}" for p, g in zip(logp, lines, strict=True)]
            lines_by_order.append(lines)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\\data\\\n" + "".join(f"ngram {k}={len(v)}\n" for k, v in enumerate(lines_by_order, 1)))
            for k, lines in enumerate(lines_by_order, 1):
                f.write(f"\n\\{k}-grams:\n" + "\n".join(lines) + "\n")
            f.write("\n\\end\\\n")

    def _levels(self, grams: np.ndarray, m: int) -> list[np.ndarray]:
        """Context ids per level 0..order-1 of `grams` (P, m) taken as contexts (oldest first), -1 past m."""
        n = self.order
        ctx = np.zeros((len(grams), n - 1), dtype=np.int64)
        if m:
            ctx[:, n - 1 - m:] = grams
        ids = self._context_ids(ctx)
        return [x if level <= m else np.full(len(grams), -1) for level, x in enumerate(ids)]

    def save(self, directory: str | Path) -> None:
        """Write `config.json` and `ngrams_<k>.parquet` for k = 1..order. Loading reads the order-n
        table (the sufficient statistic); the lower orders are derived views for readers."""
        self._check_fitted()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for k in range(1, self.order + 1):
            self.ngram_table(k).write_parquet(d / f"ngrams_{k}.parquet")
        config = {"format": FORMAT, "format_version": FORMAT_VERSION, **self.get_params(),
                  "vocab_size_": self.vocab_size_}
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> NgramLM:
        """Read a model written by `save`; its probabilities equal the saved model's exactly."""
        d = Path(directory)
        path = d / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise InputError(f"{path}: cannot read the n-gram config ({e}); point to a directory written by "
                             f"NgramLM.save") from e
        if config.get("format") != FORMAT or config.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} model config")
        names = [*cls.param_names(), "vocab_size_"]
        if missing := [k for k in names if k not in config]:
            raise InputError(f"{path}: the n-gram config lacks {', '.join(missing)}; rebuild the model")
        model = cls(**{k: config[k] for k in names[:-1]})
        n, V = model.order, int(config["vocab_size_"])
        table_path = d / f"ngrams_{n}.parquet"
        try:
            table = pl.read_parquet(table_path)
        except (OSError, pl.exceptions.PolarsError) as e:
            raise InputError(f"{table_path}: cannot read the n-gram table ({e}); rebuild the model") from e
        rows = np.stack([table[f"w{i}"].to_numpy().astype(np.int64) for i in range(1, n + 1)], axis=1)
        model.vocab_size_ = V
        known = np.zeros(V, dtype=bool)
        known[rows[:, -1]] = True  # every word the model predicts, plus the specials it keeps
        known[[model.unk_id, model.bos_id, model.eos_id]] = True
        model.known_ = known
        model._build(rows, table["count"].to_numpy().astype(np.int64))
        return model
