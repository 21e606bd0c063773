"""The unknown-word models: P(t | w) for a word never seen in train, from TnT's suffix distributions
(successive abstraction, one model for capitalised and one for other words) and a multinomial
logistic regression on word features, mixed log-linearly and turned into an emission score
P(w | t) ∝ P(t | w) / P(t)^kappa; case-variant backoff to the word's known other casings."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from lexiflow.models.hmm.calibration import Calibration
from lexiflow.models.hmm.counts import log

logger = logging.getLogger("lexiflow.hmm")


def logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m


# ----------------------------------------------------------------------------------------------
# Word features


def case_class(word: str) -> str:
    """`lower`, `init` (Xxx), `upper` (XXX), `mixed` (xXx) or `none` (no cased letter)."""
    if not any(c.isalpha() for c in word):
        return "none"
    if word.isupper():
        return "upper"
    if word[0].isupper():
        return "init" if word[1:] == word[1:].lower() else "mixed"
    return "lower" if word.islower() else "mixed"


def word_shape(word: str) -> str:
    """Characters mapped to X/x/d (others kept), runs collapsed: `Mar-2009` -> `Xx-d`."""
    out: list[str] = []
    for c in word:
        s = "X" if c.isupper() else "x" if c.isalpha() else "d" if c.isdigit() else c
        if not out or out[-1] != s:
            out.append(s)
    return "".join(out)[:8]


def lr_word_features(word: str, initial: bool, known_tags: Callable[[str], list[str]]) -> list[str]:
    """Sparse binary features of one word for P(tag | word) (the model never sees the word itself);
    known_tags(w) gives the tags a known word was seen with."""
    lw = word.lower()
    cc = case_class(word)
    feats = [f"shape={word_shape(word)}", f"case={cc}", f"case_init={cc}|{initial}", f"len={min(len(word), 12)}"]
    feats += [f"s{i}={lw[-i:]}" for i in range(1, 5) if len(lw) >= i]
    feats += [f"p{i}={lw[:i]}" for i in range(1, 4) if len(lw) > i]
    if any(c.isdigit() for c in word):
        feats.append("digit")
    if "-" in word:
        feats.append("hyphen")
        last = word.rsplit("-", 1)[1].lower()
        feats += [f"hy_s3={last[-3:]}"] + [f"hy_tag={t}" for t in known_tags(last)]
    if "." in word:
        feats.append("period")
    if "'" in word or "’" in word:
        feats.append("apostrophe")
    if lw != word:
        feats += [f"lc_tag={t}" for t in known_tags(lw)]
    return feats


def csr(index_rows: list[list[int]], n_cols: int) -> sp.csr_matrix:
    indptr = np.cumsum([0] + [len(r) for r in index_rows])
    indices = np.fromiter((j for r in index_rows for j in r), dtype=np.int64, count=int(indptr[-1]))
    return sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(len(index_rows), n_cols))


# ----------------------------------------------------------------------------------------------
# TnT's suffix model


def suffix_counts(vocab: dict[str, int], emission_counts: np.ndarray, suffix_length: int,
                  rare_threshold: int) -> dict[tuple[bool, str], np.ndarray]:
    """TnT suffix counts over the rare words (count <= rare_threshold), split by capitalisation."""
    k = emission_counts.shape[1]
    totals = emission_counts.sum(axis=1)
    counts: dict[tuple[bool, str], np.ndarray] = {}
    for w, row in vocab.items():
        if totals[row] > rare_threshold:
            continue
        cased = w[:1].isupper()
        for i in range(0, min(suffix_length, len(w)) + 1):
            key = (cased, w[len(w) - i:] if i else "")
            vec = counts.get(key)
            if vec is None:
                vec = counts[key] = np.zeros(k)
            vec += emission_counts[row]
    return counts


def default_theta(state_output: list[str], tag_counts: np.ndarray) -> float:
    """TnT: the standard deviation of the unconditioned tag probabilities, over the output tags
    (states split from one tag pooled: dozens of small split states would shrink it)."""
    outputs = sorted(set(state_output))
    pooled = np.zeros(len(outputs))
    np.add.at(pooled, [outputs.index(o) for o in state_output], tag_counts)
    return float(np.std(pooled / pooled.sum(), ddof=1)) if len(outputs) > 1 else 1.0


def suffix_tables(counts: dict[tuple[bool, str], np.ndarray], k: int,
                  theta: float) -> tuple[dict[tuple[bool, str], int], np.ndarray]:
    """Successive abstraction: each suffix's P(t | suffix) mixes in its one-shorter suffix's.
    Returns {(capitalised, suffix): row} and log P(t | suffix) (S, K), never exactly -inf."""
    index: dict[tuple[bool, str], int] = {}
    keys = sorted(counts, key=lambda key: (key[0], len(key[1]), key[1]))
    table = np.zeros((len(keys), k))
    for r, key in enumerate(keys):
        phat = counts[key] / counts[key].sum()
        if key[1] == "":
            table[r] = phat
        else:
            parent = table[index[(key[0], key[1][1:])]]
            table[r] = (phat + theta * parent) / (1 + theta)
        index[key] = r
    return index, log(np.maximum(table, 1e-12))


def suffix_scores(words: Sequence[str], index: dict[tuple[bool, str], int], table: np.ndarray,
                  suffix_length: int) -> np.ndarray:
    """log P_suffix(t | w) (n, K): the longest seen suffix of the word's casing decides."""
    out = np.zeros((len(words), table.shape[1]))
    for r, w in enumerate(words):
        cased = w[:1].isupper()
        row = index.get((cased, ""))
        if row is None:  # no rare word of this casing: use the other casing's tables
            cased = not cased
            row = index.get((cased, ""), 0)
        for i in range(1, min(suffix_length, len(w)) + 1):
            nxt = index.get((cased, w[len(w) - i:]))
            if nxt is None:
                break
            row = nxt
        out[r] = table[row] if len(table) else 0.0
    return out


# ----------------------------------------------------------------------------------------------
# The logistic regression


def fit_logreg(feat_rows: list[list[str]], y: list[int], k: int, C: float, max_iter: int,
               seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Multinomial logistic regression P(tag | word features): feature names, weights (F, K), bias (K,)."""
    if len(set(y)) < 2:
        logger.warning("hmm.fit: too few rare words for the logistic regression; using the suffix model only")
        return [], np.zeros((0, k)), np.zeros(k)
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    names = sorted({f for row in feat_rows for f in row})
    index = {f: i for i, f in enumerate(names)}
    x = csr([[index[f] for f in row] for row in feat_rows], len(names))
    clf = LogisticRegression(C=C, max_iter=max_iter, random_state=seed)
    with threadpool_limits(1), warnings.catch_warnings():  # small BLAS calls: threads only contend
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter is the chosen budget; logged below
        clf.fit(x, np.asarray(y))
    coef, intercept = clf.coef_, clf.intercept_
    if len(clf.classes_) == 2:  # scikit-learn's binary model scores classes_[1]; as a softmax, classes_[0] scores 0
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.array([0.0, intercept[0]])
    weights = np.zeros((len(names), k))
    # Tags never seen on a rare word get a bias far below the others: possible, but very unlikely.
    bias = np.full(k, float(np.min(intercept)) - 10.0)
    weights[:, clf.classes_] = coef.T
    bias[clf.classes_] = intercept
    logger.info("hmm.fit: logistic regression on %d rare-word tokens, %d features, %d iterations",
                len(y), len(names), int(np.max(clf.n_iter_)))
    return names, weights, bias


def logreg_scores(feature_rows: list[list[str]], index: dict[str, int], weights: np.ndarray,
                  bias: np.ndarray) -> np.ndarray:
    """log P_lr(t | w) (n, K) from each word's feature names (unseen features ignored)."""
    idx = [[j for f in row if (j := index.get(f)) is not None] for row in feature_rows]
    logits = csr(idx, len(weights)) @ weights + bias
    return logits - logsumexp(logits)


# ----------------------------------------------------------------------------------------------
# Emission scores


def unknown_scores(suf: np.ndarray, lr: np.ndarray, log_prior: np.ndarray, cal: Calibration) -> np.ndarray:
    """log P(w | t) up to a per-word constant: log P(t | w) - kappa log P(t), P(t | w) a normalised
    log-linear mix of the suffix and logistic-regression distributions. kappa (`prior_weight`) = 1 is
    Bayes' rule; a calibrated kappa < 1 is the prior scaling of hybrid HMM/classifier models
    (Bourlard & Morgan 1994): P(t | w) is fit on rare words and over-divided by a small P(t)."""
    a = cal.unknown_mix
    mix = (1 - a) * suf + a * lr
    return mix - logsumexp(mix) - cal.prior_weight * log_prior


def mix_case_variants(scores: np.ndarray, variant_counts: list[tuple[int, np.ndarray]], tag_counts: np.ndarray,
                      n_tokens: float, mu: float) -> None:
    """Case-variant backoff, in place: an unknown word whose other casings are known (`mexico`: `Mexico`;
    `Cigar`: `cigar`) gets P(w | t) = mu P(variants | t) + (1 - mu) P_unknown(w | t), the variants' counts
    pooled, the unknown model on the rare-word scale P(t | w) P(w) / P(t)^kappa with P(w) = 1 / N (seen once).
    variant_counts: (row of scores, pooled emission counts (K,)) per word that has known variants."""
    if not variant_counts:
        return
    idx = np.asarray([i for i, _ in variant_counts])
    counts = np.stack([c for _, c in variant_counts])
    with np.errstate(divide="ignore"):
        known = np.log(mu) + log(counts / tag_counts[None, :])
    unk = np.log1p(-mu) + scores[idx] - np.log(n_tokens)
    scores[idx] = np.logaddexp(known, unk)
