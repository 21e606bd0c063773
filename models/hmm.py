"""Hidden Markov model part-of-speech tagger: supervised maximum likelihood, TnT-style smoothing.

The model (Jurafsky & Martin, SLP3 ch. 8 / appendix A; Brants 2000, "TnT - a statistical
part-of-speech tagger", ANLP):

- states are tags, observations are words, with a dummy boundary state `<s>` before the first word
  and `</s>` after the last;
- as taught (order=2): initial pi(s) = P(s | <s>) = Count(<s>, s) / #sentences, transitions
  P(s_i | s_{i-1}) = Count(s_{i-1}, s_i) / Count(s_{i-1}), emissions P(o | s) = Count(s, o) / Count(s);
  these raw maximum-likelihood tables are `initial_probs()`, `transition_probs()`, `emission_probs()`;
- for decoding, transitions are smoothed by linear interpolation with weights found by deleted
  interpolation (TnT): P(t3 | t1, t2) = l1 P^(t3) + l2 P^(t3 | t2) + l3 P^(t3 | t1, t2) (order=3 is the
  trigram model whose Viterbi runs over state pairs);
- unknown words: TnT's suffix distributions with successive abstraction,
  P(t | l_{n-i+1..n}) = (P^(t | l_{n-i+1..n}) + theta P(t | l_{n-i+2..n})) / (1 + theta), one model for
  capitalised and one for other words, combined log-linearly with a discriminative P(t | word
  features) (multinomial logistic regression on suffixes, prefixes, word shape, capitalisation,
  digits, hyphens, the tags the lowercased form or the last hyphen part has as a known word), fit
  on the rare words of train. Both are turned into an emission score, P(w | t) ∝ P(t | w) / P(t)^kappa
  (Bayes' rule at kappa = 1; kappa calibrated, the prior scaling of hybrid HMM/classifier models), mixed
  with the pooled emissions of the word's known other casings (`mexico` -> `Mexico`) when there are any;
  the mixing weights, kappa and the emission weights are calibrated on dev;
- state splits (supervised, so still plain MLE): `(word, tag, refinement)` training items make the states
  `tag|refinement` (UPOS split by XPOS, ...), and the `lexicalize` most frequent ambiguous words get
  word-specific states `tag|word` (Pla & Molina 2004, "Improving part-of-speech tagging using
  lexicalized HMMs"); `tag` maps states back to tags;
- words seen at most `rare_max_count` times mix their counted emission with the unknown-word model
  (a seen-once word has usually shown only one of its tags); a capitalised sentence-initial word
  unseen in that form uses the emissions of its lowercased form when that one is known.

Decoding is in log space. Viterbi is vectorised with numpy, O(n K^2) (order 2: batched over
equal-length sentences; order 3: over (previous, current) state pairs, all sentences at once as flat
arrays of candidate triples), each position restricted to its candidate tags (possible, within `prune`
of the best emission score, at most `max_candidates`; `max_candidates >= K` with `prune=None` is
exact). Greedy: s_t = argmax P(s | s_{t-1}) P(o_t | s), batched. Beam search of width beta with
recombination of hypotheses ending in the same state (order 3: the same pair of states): O(n K beta),
equal to Viterbi when beta is at least the number of states (order 3: of state pairs, K (K + 1) with <s>).

Everything learned is kept as counts and coefficients and saved as Parquet plus a JSON config;
`load` rebuilds the decoding tables with the same code as `fit`, so a round trip is exact.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import polars as pl
import scipy.sparse as sp
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.progress import Progress

logger = logging.getLogger("lexiflow.hmm")

BOS, EOS = "<s>", "</s>"
FORMAT_VERSION = 1
METHODS = ("viterbi", "greedy", "beam")
UNKNOWN_MODELS = ("suffix", "logreg", "both")
_NEG = -np.inf


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x)


def _logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m


# ----------------------------------------------------------------------------------------------
# Word features of the unknown-word models


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


# ----------------------------------------------------------------------------------------------
# The tagger


class HMMTagger:
    """Supervised HMM tagger (order 2: bigram, order 3: trigram) with a TnT + logistic-regression
    unknown-word model. Parameters are set here and never changed by `fit`; learned state ends in `_`.

    lambdas: transition interpolation weights (unigram, bigram[, trigram]); None = deleted interpolation.
    suffix_length, rare_threshold, theta: TnT's suffix model (longest suffix, words of at most this
      count feed it, the abstraction weight; None = the standard deviation of the tag probabilities).
    unknown: "suffix", "logreg" or "both" (log-linear mix, weight calibrated on dev).
    lr_max_count, lr_C: the logistic regression learns from tokens of words seen at most this often
      in train; its inverse L2 strength.
    rare_max_count: known words seen at most this often mix in the unknown-word model (weight on dev).
    prior_weight: kappa in the unknown-word emission P(t | w) / P(t)^kappa (1 = Bayes' rule).
    case_mix: weight of the pooled emissions of an unknown word's known other casings (0 = off).
    unknown_mix, emission_weight, unknown_weight, rare_mix, prior_weight, case_mix: calibration values; None =
      tuned on the `dev` sentences given to `fit` (defaults 0.5, 1, 1, 0, 1, 0 without dev).
    lexicalize: the N most frequent words seen with more than one tag get states of their own, `state|word`
      (a lexicalised HMM, Pla & Molina 2004): transitions then see which of those words came before.
    max_candidates, prune: Viterbi keeps per position at most this many tags, best by emission score, and
      drops tags scoring more than `prune` (log) below the best (None: no threshold); max_candidates >= K
      and prune None is exact Viterbi.
    """

    def __init__(
        self,
        order: int = 3,
        *,
        lambdas: Sequence[float] | None = None,
        suffix_length: int = 10,
        rare_threshold: int = 10,
        theta: float | None = None,
        unknown: str = "both",
        lr_max_count: int = 1,
        lr_C: float = 1.0,
        rare_max_count: int = 1,
        lowercase_initial: bool = True,
        unknown_mix: float | None = None,
        emission_weight: float | None = None,
        unknown_weight: float | None = None,
        rare_mix: float | None = None,
        prior_weight: float | None = None,
        case_mix: float | None = None,
        lexicalize: int = 30,
        max_candidates: int = 8,
        prune: float | None = 8.0,
        max_iter: int = 300,
        seed: int = 0,
    ) -> None:
        self.order = order
        self.lambdas = lambdas
        self.suffix_length = suffix_length
        self.rare_threshold = rare_threshold
        self.theta = theta
        self.unknown = unknown
        self.lr_max_count = lr_max_count
        self.lr_C = lr_C
        self.rare_max_count = rare_max_count
        self.lowercase_initial = lowercase_initial
        self.unknown_mix = unknown_mix
        self.emission_weight = emission_weight
        self.unknown_weight = unknown_weight
        self.rare_mix = rare_mix
        self.prior_weight = prior_weight
        self.case_mix = case_mix
        self.lexicalize = lexicalize
        self.max_candidates = max_candidates
        self.prune = prune
        self.max_iter = max_iter
        self.seed = seed

    # ------------------------------------------------------------------ parameters

    def get_params(self) -> dict:
        keys = ("order", "lambdas", "suffix_length", "rare_threshold", "theta", "unknown", "lr_max_count", "lr_C",
                "rare_max_count", "lowercase_initial", "unknown_mix", "emission_weight", "unknown_weight",
                "rare_mix", "prior_weight", "case_mix", "lexicalize", "max_candidates", "prune", "max_iter", "seed")
        out = {k: getattr(self, k) for k in keys}
        out["lambdas"] = None if self.lambdas is None else [float(x) for x in self.lambdas]
        return out

    def _check_params(self) -> None:
        if self.order not in (2, 3):
            raise ParameterError(f"order={self.order!r}: use 2 (bigram HMM) or 3 (trigram HMM)")
        if self.lambdas is not None:
            lam = [float(x) for x in self.lambdas]
            if len(lam) != self.order or min(lam) < 0 or abs(sum(lam) - 1) > 1e-9:
                raise ParameterError(
                    f"lambdas={self.lambdas!r}: give {self.order} non-negative weights summing to 1 "
                    "(unigram, bigram[, trigram]) or None for deleted interpolation")
        if self.unknown not in UNKNOWN_MODELS:
            raise ParameterError(f"unknown={self.unknown!r}: choose one of {', '.join(UNKNOWN_MODELS)}")
        if self.max_candidates < 1:
            raise ParameterError(f"max_candidates={self.max_candidates}: must be >= 1")
        if self.suffix_length < 0 or self.rare_threshold < 1:
            raise ParameterError("suffix_length must be >= 0 and rare_threshold >= 1")
        if self.prior_weight is not None and self.prior_weight < 0:
            raise ParameterError(f"prior_weight={self.prior_weight}: must be >= 0 (1 = Bayes' rule) or None")
        if self.case_mix is not None and not 0 <= self.case_mix < 1:
            raise ParameterError(f"case_mix={self.case_mix}: must be in [0, 1) or None")
        if self.theta is not None and self.theta < 0:
            raise ParameterError(f"theta={self.theta}: must be >= 0 or None")
        calibration = {"unknown_mix": (lambda v: 0 <= v <= 1, "in [0, 1]"),
                       "rare_mix": (lambda v: 0 <= v < 1, "in [0, 1)"),
                       "emission_weight": (lambda v: v > 0, "> 0"), "unknown_weight": (lambda v: v > 0, "> 0")}
        for name, (valid, span) in calibration.items():
            value = getattr(self, name)
            if value is not None and not valid(value):  # NaN fails too
                raise ParameterError(f"{name}={value}: must be {span}, or None to tune it on dev")

    # ------------------------------------------------------------------ training

    def fit(
        self,
        sentences: Iterable[Sequence[tuple[str, str]]],
        dev: Iterable[Sequence[tuple[str, str]]] | None = None,
    ) -> HMMTagger:
        """Count tags, tag bigrams/trigrams and (tag, word) pairs; fit the unknown-word models; with
        `dev` sentences, calibrate the values left as None on them (dev accuracy). Empty sentences are
        skipped. Items may be (word, tag, refinement) triples: the HMM's states are then `tag|refinement`
        (e.g. UPOS refined by XPOS, a supervised state split) and `tag` returns the tag part."""
        self._check_params()
        triples = _validate_tagged(sentences, "sentences")
        if not triples:
            raise InputError("fit: no tagged sentence with at least one word; pass (word, tag) pair lists")
        # states: the tag, or tag|refinement when a training-only refinement was given
        if self.lexicalize > 0:
            freq = Counter(w for s in triples for w, _, _ in s)
            seen: dict[str, set[str]] = defaultdict(set)
            for s in triples:
                for w, _, st in s:
                    seen[w].add(st)
            lex = {w for w, _ in sorted(((w, c) for w, c in freq.items() if len(seen[w]) > 1),
                                       key=lambda wc: (-wc[1], wc[0]))[:self.lexicalize]}
            triples = [[(w, t, f"{st}|{w}" if w in lex else st) for w, t, st in s] for s in triples]
        state_out = {st: t for s in triples for _, t, st in s}
        sents = [[(w, st) for w, _, st in s] for s in triples]
        tags = sorted(state_out)
        self.state_output_ = [state_out[st] for st in tags]
        tid = {t: i for i, t in enumerate(tags)}
        k = len(tags)
        c2 = np.zeros((k + 1, k + 1))  # [prev, cur]; row k = <s>, column k = </s>
        c3 = np.zeros((k + 1, k + 1, k + 1))  # [prev2, prev, cur]
        vocab: dict[str, int] = {}
        pairs: Counter[tuple[int, int]] = Counter()
        with Progress("hmm.fit", total=len(sents), unit="sentences") as prog:
            for s in sents:
                ids = [k, k] + [tid[t] for _, t in s] + [k]
                for a, b, c in zip(ids, ids[1:], ids[2:], strict=False):
                    c2[b, c] += 1
                    c3[a, b, c] += 1
                for w, t in s:
                    pairs[vocab.setdefault(w, len(vocab)), tid[t]] += 1
                prog.update()
        emit = np.zeros((len(vocab), k))
        rows, cols = zip(*pairs.keys(), strict=True)
        emit[list(rows), list(cols)] = list(pairs.values())
        self.tags_ = tags
        self.vocab_ = vocab
        self.bigram_counts_ = c2
        self.trigram_counts_ = c3
        self.emission_counts_ = emit
        self._fit_suffixes()
        self.lr_features_, self.lr_weights_, self.lr_bias_ = self._fit_logreg(sents)
        self.calibration_ = {"unknown_mix": 0.5, "emission_weight": 1.0, "unknown_weight": 1.0, "rare_mix": 0.0,
                             "prior_weight": 1.0, "case_mix": 0.0}
        if self.unknown == "suffix":
            self.calibration_["unknown_mix"] = 0.0
        elif self.unknown == "logreg":
            self.calibration_["unknown_mix"] = 1.0
        for key in self.calibration_:
            if getattr(self, key) is not None:
                self.calibration_[key] = float(getattr(self, key))
        self._finalize()
        if dev is not None:
            self._calibrate(_validate_tagged(dev, "dev"))
        return self

    def _fit_suffixes(self) -> None:
        """TnT suffix counts over the rare words (count <= rare_threshold), split by capitalisation."""
        k = len(self.tags_)
        totals = self.emission_counts_.sum(axis=1)
        suffix_counts: dict[tuple[bool, str], np.ndarray] = {}
        for w, row in self.vocab_.items():
            if totals[row] > self.rare_threshold:
                continue
            cased = w[:1].isupper()
            for i in range(0, min(self.suffix_length, len(w)) + 1):
                key = (cased, w[len(w) - i:] if i else "")
                vec = suffix_counts.get(key)
                if vec is None:
                    vec = suffix_counts[key] = np.zeros(k)
                vec += self.emission_counts_[row]
        self.suffix_counts_ = suffix_counts

    def _lr_word_features(self, word: str, initial: bool) -> list[str]:
        """Sparse binary features of one word for P(tag | word) (the model never sees the word itself)."""
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
            feats += [f"hy_s3={last[-3:]}"] + [f"hy_tag={t}" for t in self._known_tags(last)]
        if "." in word:
            feats.append("period")
        if "'" in word or "’" in word:
            feats.append("apostrophe")
        if lw != word:
            feats += [f"lc_tag={t}" for t in self._known_tags(lw)]
        return feats

    def _known_tags(self, word: str) -> list[str]:
        row = self.vocab_.get(word)
        if row is None:
            return []
        return [self.tags_[j] for j in np.flatnonzero(self.emission_counts_[row])]

    def _fit_logreg(self, sents: list[list[tuple[str, str]]]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Multinomial logistic regression P(tag | word features) on tokens of rare words of train."""
        k = len(self.tags_)
        if self.unknown == "suffix":
            return [], np.zeros((0, k)), np.zeros(k)
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.linear_model import LogisticRegression
        from threadpoolctl import threadpool_limits

        totals = self.emission_counts_.sum(axis=1)
        tid = {t: i for i, t in enumerate(self.tags_)}
        feat_rows: list[list[str]] = []
        y: list[int] = []
        for s in sents:
            for pos, (w, t) in enumerate(s):
                if totals[self.vocab_[w]] <= self.lr_max_count:
                    feat_rows.append(self._lr_word_features(w, pos == 0))
                    y.append(tid[t])
        if len(set(y)) < 2:
            logger.warning("hmm.fit: too few rare words for the logistic regression; using the suffix model only")
            return [], np.zeros((0, k)), np.zeros(k)
        names = sorted({f for row in feat_rows for f in row})
        index = {f: i for i, f in enumerate(names)}
        x = _csr([[index[f] for f in row] for row in feat_rows], len(names))
        clf = LogisticRegression(C=self.lr_C, max_iter=self.max_iter, random_state=self.seed)
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

    def _finalize(self) -> None:
        """Build every decoding table from the counts and coefficients (shared by fit and load)."""
        k = len(self.tags_)
        c2, c3 = self.bigram_counts_, self.trigram_counts_
        self.tag_counts_ = c2[:k, :].sum(axis=1)  # occurrences of each tag (as a predecessor, </s> included)
        n_sent = c2[k, :].sum()
        ctx = np.concatenate([self.tag_counts_, [n_sent]])  # Count(prev), <s> included
        outcome = c2.sum(axis=0)  # occurrences as an outcome, </s> included
        p1 = outcome / outcome.sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            p2 = np.where(ctx[:, None] > 0, c2 / ctx[:, None], 0.0)
            pair = c3.sum(axis=2)  # Count(prev2, prev) as a history; (<s>, <s>) = #sentences
            p3 = np.where(pair[:, :, None] > 0, c3 / pair[:, :, None], 0.0)
        if self.lambdas is not None:
            lam = np.asarray([float(x) for x in self.lambdas])
        else:
            lam = self._deleted_interpolation(outcome, ctx)
        self.lambdas_ = lam
        if self.order == 2:
            trans = lam[0] * p1[None, :] + lam[1] * p2
        else:
            trans = lam[0] * p1[None, None, :] + lam[1] * p2[None, :, :] + lam[2] * p3
        self.log_trans_ = _log(trans)  # (K+1, K+1[, K+1]): first axes previous tags (K = <s>), last axis K = </s>
        self.log_prior_ = _log(self.tag_counts_ / self.tag_counts_.sum())  # (K,) log P(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.log_emit_ = _log(self.emission_counts_ / self.tag_counts_[None, :])  # (V, K)
        self.word_counts_ = self.emission_counts_.sum(axis=1)
        self._build_suffix_tables()
        self._lr_index = {f: i for i, f in enumerate(self.lr_features_)}
        # (word, sentence-initial) -> (log P_suffix, log P_lr): independent of the calibration values
        self._unk_cache: dict[tuple[str, bool], tuple[np.ndarray, np.ndarray]] = {}
        self._case_variants: dict[str, list[int]] = defaultdict(list)  # lowercased form -> vocab rows
        for w, row in self.vocab_.items():
            self._case_variants[w.lower()].append(row)
        self._rare_components = None
        self._apply_calibration()

    def _deleted_interpolation(self, outcome: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        """Brants (2000), fig. 1: each n-gram votes, with its count, for the order whose estimate
        (leaving this occurrence out) is largest."""
        c2, c3 = self.bigram_counts_, self.trigram_counts_
        pair = c3.sum(axis=2)
        n = outcome.sum()
        lam = np.zeros(self.order)

        def frac(a: float, b: float) -> float:
            return (a - 1) / (b - 1) if b > 1 else 0.0

        if self.order == 2:
            for j, k in zip(*np.nonzero(c2), strict=True):
                est = [frac(outcome[k], n), frac(c2[j, k], ctx[j])]
                lam[int(np.argmax(est))] += c2[j, k]
        else:
            for i, j, k in zip(*np.nonzero(c3), strict=True):
                est = [frac(outcome[k], n), frac(c2[j, k], ctx[j]), frac(c3[i, j, k], pair[i, j])]
                lam[int(np.argmax(est))] += c3[i, j, k]
        return lam / lam.sum()

    def _build_suffix_tables(self) -> None:
        """Successive abstraction: each suffix's P(t | suffix) mixes in its one-shorter suffix's."""
        k = len(self.tags_)
        self.suffix_index_: dict[tuple[bool, str], int] = {}
        keys = sorted(self.suffix_counts_, key=lambda key: (key[0], len(key[1]), key[1]))
        table = np.zeros((len(keys), k))
        theta = self.theta
        if theta is None:  # TnT: the standard deviation of the unconditioned tag probabilities, over the
            # output tags (states split from one tag pooled: dozens of small split states would shrink it)
            outputs = sorted(set(self.state_output_))
            pooled = np.zeros(len(outputs))
            np.add.at(pooled, [outputs.index(o) for o in self.state_output_], self.tag_counts_)
            theta = float(np.std(pooled / pooled.sum(), ddof=1)) if len(outputs) > 1 else 1.0
        self.theta_ = theta
        for r, key in enumerate(keys):
            counts = self.suffix_counts_[key]
            phat = counts / counts.sum()
            if key[1] == "":
                table[r] = phat
            else:
                parent = table[self.suffix_index_[(key[0], key[1][1:])]]
                table[r] = (phat + theta * parent) / (1 + theta)
            self.suffix_index_[key] = r
        self.suffix_log_ = _log(np.maximum(table, 1e-12))  # (S, K): never exactly 0 for an unknown word

    # ------------------------------------------------------------------ unknown-word scores

    def _unknown_components(self, words: Sequence[str], initial: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
        """(log P_suffix(t | w), log P_lr(t | w)), each (n, K), for words treated as unknown."""
        k = len(self.tags_)
        suf = np.zeros((len(words), k))
        for r, w in enumerate(words):
            cased = w[:1].isupper()
            row = self.suffix_index_.get((cased, ""))
            if row is None:  # no rare word of this casing: use the other casing's tables
                cased = not cased
                row = self.suffix_index_.get((cased, ""), 0)
            for i in range(1, min(self.suffix_length, len(w)) + 1):
                nxt = self.suffix_index_.get((cased, w[len(w) - i:]))
                if nxt is None:
                    break
                row = nxt
            suf[r] = self.suffix_log_[row] if len(self.suffix_log_) else 0.0
        if not len(self.lr_features_):
            return suf, suf
        idx = [[j for f in self._lr_word_features(w, b) if (j := self._lr_index.get(f)) is not None]
               for w, b in zip(words, initial, strict=True)]
        logits = _csr(idx, len(self.lr_features_)) @ self.lr_weights_ + self.lr_bias_
        return suf, logits - _logsumexp(logits)

    def _unknown_scores(self, suf: np.ndarray, lr: np.ndarray) -> np.ndarray:
        """log P(w | t) up to a per-word constant: log P(t | w) - kappa log P(t), P(t | w) a normalised
        log-linear mix of the suffix and logistic-regression distributions. kappa (`prior_weight`) = 1 is
        Bayes' rule; a calibrated kappa < 1 is the prior scaling of hybrid HMM/classifier models
        (Bourlard & Morgan 1994): P(t | w) is fit on rare words and over-divided by a small P(t)."""
        a = self.calibration_["unknown_mix"]
        mix = (1 - a) * suf + a * lr
        return mix - _logsumexp(mix) - self.calibration_["prior_weight"] * self.log_prior_

    def _apply_calibration(self) -> None:
        """Known-word emission table, rare known words mixed with the unknown-word model."""
        table = self.log_emit_.copy()
        mu = self.calibration_["rare_mix"]
        rare = np.flatnonzero(self.word_counts_ <= self.rare_max_count)
        if mu > 0 and len(rare):
            if getattr(self, "_rare_components", None) is None:  # independent of the calibration values
                words = list(self.vocab_)
                self._rare_components = self._unknown_components([words[r] for r in rare], [False] * len(rare))
            unk = self._unknown_scores(*self._rare_components)
            # Same scale as counts: P(w|t) = P(t|w) P(w) / P(t) with P(w) = Count(w) / N.
            log_pw = np.log(self.word_counts_[rare] / self.word_counts_.sum())[:, None]
            with np.errstate(divide="ignore"):
                table[rare] = np.logaddexp(np.log1p(-mu) + table[rare], np.log(mu) + unk + log_pw)
        self._emit_table = table * self.calibration_["emission_weight"]
        self._cand_key = None

    def _calibrate(self, dev: list[list[tuple[str, str, str]]]) -> None:
        """Coordinate search on dev accuracy (Viterbi) over the calibration values left as None."""
        dev = [s for s in dev if s]
        if not dev:
            return
        words = [[w for w, _, _ in s] for s in dev]
        out_id = {t: i for i, t in enumerate(self.state_output_)}  # any state of that output tag
        gold = np.asarray([out_id.get(t, -1) for s in dev for _, t, _ in s])
        proj = np.asarray([out_id[t] for t in self.state_output_])
        grids = {
            "unknown_mix": [0.0, 0.25, 0.5, 0.6, 0.75, 0.9, 1.0],
            "unknown_weight": [0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5],
            "emission_weight": [0.7, 0.8, 0.9, 1.0, 1.1, 1.2],
            "rare_mix": [0.0, 0.05, 0.1, 0.2, 0.3, 0.5],
            "prior_weight": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
            "case_mix": [0.0, 0.01, 0.03, 0.1, 0.3, 0.5],
        }
        if self.unknown != "both":
            grids.pop("unknown_mix")
        free = [key for key in grids if getattr(self, key) is None]

        def score() -> float:
            self._apply_calibration()
            pred = proj[np.concatenate([np.asarray(p, dtype=np.int64) for p in self._tag_ids(words, "viterbi")])]
            return float(np.mean(pred == gold))

        best = score()
        for _ in range(2):
            changed = False
            for key in free:
                for value in grids[key]:
                    old = self.calibration_[key]
                    if value == old:
                        continue
                    self.calibration_[key] = value
                    acc = score()
                    if acc > best + 1e-12:
                        best, changed = acc, True
                        logger.info("hmm.calibrate: %s=%s dev accuracy %.4f", key, value, acc)
                    else:
                        self.calibration_[key] = old
            if not changed:
                break
        self.dev_accuracy_ = best
        self._apply_calibration()

    # ------------------------------------------------------------------ emissions of a sentence

    def is_known(self, word: str) -> bool:
        return word in self.vocab_

    def _emissions(self, words: Sequence[str]) -> np.ndarray:
        """(n, K) weighted log emission scores of one sentence."""
        return self._emissions_flat([list(words)])

    def _emissions_flat(self, sentences: list[list[str]]) -> np.ndarray:
        """(N, K) weighted log emission scores of all tokens of `sentences`, concatenated."""
        rows, unk = self._token_rows(sentences)
        n_known = len(self._emit_table)
        known = rows < n_known
        out = np.empty((len(rows), len(self.tags_)))
        out[known] = self._emit_table[rows[known]]
        out[~known] = unk[rows[~known] - n_known]
        return out

    def _token_rows(self, sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Row of each token: < V a known word's emission row, V + u the u-th row of the returned unknown
        scores (U, K). Unknown words are scored once per distinct (word, sentence-initial), in one batch."""
        rows: list[int] = []
        unknown: dict[tuple[str, bool], int] = {}
        n_known = len(self._emit_table)
        vocab = self.vocab_
        for s in sentences:
            for i, w in enumerate(s):
                row = vocab.get(w)
                if row is None and i == 0 and self.lowercase_initial and w[:1].isupper():
                    row = vocab.get(w.lower())
                if row is None:
                    row = n_known + unknown.setdefault((w, i == 0), len(unknown))
                rows.append(row)
        if not unknown:
            return np.asarray(rows, dtype=np.int64), np.zeros((0, len(self.tags_)))
        keys = list(unknown)
        todo = [key for key in keys if key not in self._unk_cache]
        if todo:
            suf, lr = self._unknown_components([w for w, _ in todo], [b for _, b in todo])
            if len(self._unk_cache) > 500_000:
                self._unk_cache.clear()
            for key, a, b in zip(todo, suf, lr, strict=True):
                self._unk_cache[key] = (a, b)
        suf = np.stack([self._unk_cache[key][0] for key in keys])
        lr = np.stack([self._unk_cache[key][1] for key in keys])
        scores = self._unknown_scores(suf, lr)
        mu = self.calibration_["case_mix"]
        if mu > 0:
            self._mix_case_variants([w for w, _ in keys], scores, mu)
        return np.asarray(rows, dtype=np.int64), scores * self.calibration_["unknown_weight"]

    def _mix_case_variants(self, words: list[str], scores: np.ndarray, mu: float) -> None:
        """Case-variant backoff, in place: an unknown word whose other casings are known (`mexico`: `Mexico`;
        `Cigar`: `cigar`) gets P(w | t) = mu P(variants | t) + (1 - mu) P_unknown(w | t), the variants' counts
        pooled, the unknown model on the rare-word scale P(t | w) P(w) / P(t)^kappa with P(w) = 1 / N (seen once)."""
        hits = [(i, rows) for i, w in enumerate(words) if (rows := self._case_variants.get(w.lower()))]
        if not hits:
            return
        idx = np.asarray([i for i, _ in hits])
        counts = np.stack([self.emission_counts_[rows].sum(axis=0) for _, rows in hits])
        with np.errstate(divide="ignore"):
            known = np.log(mu) + _log(counts / self.tag_counts_[None, :])
        unk = np.log1p(-mu) + scores[idx] - np.log(self.word_counts_.sum())
        scores[idx] = np.logaddexp(known, unk)

    def _known_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of every known word's emission row, cached per (max_candidates, prune)."""
        key = (self.max_candidates, self.prune)
        if getattr(self, "_cand_key", None) != key:
            self._cand = self._token_candidates(self._emit_table)
            self._cand_key = key
        return self._cand

    # ------------------------------------------------------------------ decoding

    def tag(self, words: Sequence[str], method: str = "viterbi", beam_width: int = 8) -> list[str]:
        """Tags of one tokenised sentence (an empty sentence gives [])."""
        return self.tag_many([words], method=method, beam_width=beam_width)[0]

    def tag_many(self, sentences: Sequence[Sequence[str]], method: str = "viterbi",
                 beam_width: int = 8) -> list[list[str]]:
        """Tags of many tokenised sentences; Viterbi and greedy run batched over equal-length sentences."""
        self._check_fitted()
        ids = self._tag_ids(_validate_words(sentences), method, beam_width)
        return [[self.state_output_[j] for j in s] for s in ids]

    def tag_text(self, text: str, method: str = "viterbi") -> list[list[tuple[str, str]]]:
        """Split plain text into sentences and words (models.text) and tag them: [[(word, tag), ...], ...]."""
        from lexiflow.models.text import pretokenize, split_sentences

        sents = [pretokenize(s) for s in split_sentences(text)]
        sents = [s for s in sents if s]
        return [list(zip(s, t, strict=True)) for s, t in zip(sents, self.tag_many(sents, method=method), strict=True)]

    def _tag_ids(self, sentences: list[list[str]], method: str, beam_width: int = 8) -> list[list[int]]:
        if method not in METHODS:
            raise ParameterError(f"method={method!r}: choose one of {', '.join(METHODS)}")
        if method == "beam" and beam_width < 1:
            raise ParameterError(f"beam_width={beam_width}: must be >= 1")
        out: list[list[int]] = [[] for _ in sentences]
        if method == "beam":
            with Progress("hmm.tag", total=sum(map(len, sentences)), unit="tokens") as prog:
                for i, s in enumerate(sentences):
                    if s:
                        out[i] = self._beam(self._emissions(s), beam_width)
                    prog.update(len(s))
            return out
        decode = self._viterbi_batch if method == "viterbi" else self._greedy_batch
        with Progress("hmm.tag", total=sum(map(len, sentences)), unit="tokens") as prog:
            chunk_start = 0
            while chunk_start < len(sentences):  # chunks of ~50k tokens bound the emission arrays
                chunk_end, n_tok = chunk_start, 0
                while chunk_end < len(sentences) and (n_tok < 50_000 or chunk_end == chunk_start):
                    n_tok += len(sentences[chunk_end])
                    chunk_end += 1
                chunk = sentences[chunk_start:chunk_end]
                offsets = np.cumsum([0] + [len(s) for s in chunk])
                if method == "viterbi" and self.order == 3:
                    rows, unk = self._token_rows(chunk)
                    k_ids, k_sc, k_w = self._known_candidates()
                    u_ids, u_sc, u_w = self._token_candidates(unk)
                    w = k_ids.shape[1]  # unknown rows are padded/cut to the known rows' width
                    if u_ids.shape[1] < w:
                        extra = w - u_ids.shape[1]
                        u_ids = np.pad(u_ids, ((0, 0), (0, extra)))
                        u_sc = np.pad(u_sc, ((0, 0), (0, extra)), constant_values=_NEG)
                    ids = np.concatenate([k_ids, u_ids[:, :w]])[rows]
                    sc = np.concatenate([k_sc, u_sc[:, :w]])[rows]
                    wid = np.concatenate([k_w, np.minimum(u_w, w)])[rows]
                    # at most ~4M (prev2, prev, cur) triples per step: few sentences at a time when m is large
                    group = max(1, int(4e6 // max(1, ids.shape[1]) ** 3))
                    for g0 in range(0, len(chunk), group):
                        g1 = min(g0 + group, len(chunk))
                        lo, hi = offsets[g0], offsets[g1]
                        tagged = self._viterbi_ragged(ids[lo:hi], sc[lo:hi], wid[lo:hi], np.diff(offsets[g0:g1 + 1]))
                        for i, tags in enumerate(tagged, start=g0):
                            out[chunk_start + i] = tags
                    prog.update(n_tok)
                    chunk_start = chunk_end
                    continue
                flat = self._emissions_flat(chunk)  # (N, K)
                by_len: dict[int, list[int]] = defaultdict(list)
                for i, s in enumerate(chunk):
                    if s:
                        by_len[len(s)].append(i)
                for n, members in sorted(by_len.items()):
                    for start in range(0, len(members), 2048):  # bound the (B, M, M) work arrays
                        part = members[start:start + 2048]
                        idx = offsets[part][:, None] + np.arange(n)[None, :]  # (B, n)
                        for i, tags in zip(part, decode(flat[idx]), strict=True):
                            out[chunk_start + i] = tags.tolist()
                prog.update(n_tok)
                chunk_start = chunk_end
        return out

    def _token_candidates(self, em: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidate tags of each token of em (N, K), best first: ids (N, m), scores (N, m), widths (N,)
        (how many are kept: possible, within `prune` of the best, at most max_candidates)."""
        n, k = em.shape
        m = min(self.max_candidates, k)
        if m >= k and self.prune is None:
            return np.broadcast_to(np.arange(k), (n, k)), em, np.full(n, k)
        ids = np.argpartition(-em, m - 1, axis=1)[:, :m] if m < k else np.broadcast_to(np.arange(k), (n, k))
        sc = np.take_along_axis(em, ids, axis=1)
        order = np.argsort(-sc, axis=1, kind="stable")
        ids, sc = np.take_along_axis(ids, order, axis=1), np.take_along_axis(sc, order, axis=1)
        ok = np.isfinite(sc)
        if self.prune is not None:
            ok &= sc >= sc[:, :1] - self.prune
        return ids, sc, np.maximum(np.sum(ok, axis=1), 1)

    def _viterbi_ragged(self, ids: np.ndarray, sc: np.ndarray, wid: np.ndarray,
                        lengths: np.ndarray) -> list[list[int]]:
        """Trigram Viterbi over state pairs for many sentences at once, each position with its own number
        of candidate tags (no padding to a batch's widest): one step per position handles every sentence
        still running, as flat arrays of (sentence, prev2 slot, prev slot, cur slot) triples.
        ids, sc: (N, m) candidate states and scores of the tokens of the sentences concatenated, best first;
        wid: (N,) how many candidates each token keeps; lengths (S,). Returns state ids per sentence."""
        k, k1, pad = len(self.tags_), len(self.tags_) + 1, 2
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
        flat_lt = self.log_trans_.ravel()
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

    def _candidates(self, em: np.ndarray, m: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per position the best tags by emission score, best first: ids and scores, each a list over
        positions of (B, m_t) arrays, m_t = the most possible (finite-score) tags any sentence of the
        batch has there, capped at m. With m >= K every tag is kept in tag order (exact Viterbi)."""
        b, n, k = em.shape
        if m >= k:
            ar = np.broadcast_to(np.arange(k), (b, k))
            return [ar] * n, [em[:, t] for t in range(n)]
        ids = np.argpartition(-em, m - 1, axis=2)[:, :, :m]
        sc = np.take_along_axis(em, ids, axis=2)
        if self.prune is not None:  # TnT-style beam on emissions: far less likely tags are dropped
            sc = np.where(sc >= np.max(sc, axis=2, keepdims=True) - self.prune, sc, _NEG)
        order = np.argsort(-sc, axis=2, kind="stable")
        ids, sc = np.take_along_axis(ids, order, axis=2), np.take_along_axis(sc, order, axis=2)
        need = np.maximum(np.max(np.sum(np.isfinite(sc), axis=2), axis=0), 1)  # (n,)
        return [ids[:, t, :need[t]] for t in range(n)], [sc[:, t, :need[t]] for t in range(n)]

    def _viterbi_batch(self, em: np.ndarray, m: int | None = None,
                       lattice: bool = False) -> np.ndarray | tuple[np.ndarray, list, list]:
        """Viterbi over a batch of equal-length sentences. em: (B, n, K) log emission scores.
        Returns (B, n) tag ids; with lattice=True also the per-position deltas and back-pointers (over
        candidate slots; with m >= K slot j is tag j)."""
        k, k1 = len(self.tags_), len(self.tags_) + 1
        bsz, n, _ = em.shape
        ids, sc = self._candidates(em, min(m or self.max_candidates, k))
        # Extended positions: order-1 boundary positions holding only <s> (id K), then the words.
        pad = self.order - 1
        cx = [np.full((bsz, 1), k)] * pad + ids  # each (B, m_p)
        sx = [np.zeros((bsz, 1))] * pad + sc
        flat_lt = self.log_trans_.ravel()
        rows = np.arange(bsz)
        deltas, backs = [], []
        path = np.empty((bsz, n), dtype=np.int64)
        if self.order == 2:
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

    def viterbi_lattice(self, words: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Exact Viterbi (no candidate pruning) of one sentence with its lattice: tags, deltas and
        back-pointers. Order 2: deltas (n, K) = best log score of a path ending in tag j at t, back-pointers
        (n, K) = previous tag (at t=0 it points to <s>, reported as K). Order 3: (n, K+1, K) over state pairs
        (previous tag, tag), previous tag K = <s> (only at t=0), back-pointer = the tag before the previous
        (K = <s> at t = 0, 1)."""
        self._check_fitted()
        words = _validate_words([words])[0]
        if not words:
            return [], np.zeros((0, len(self.tags_))), np.zeros((0, len(self.tags_)), dtype=np.int64)
        k = len(self.tags_)
        tags, deltas, backs = self._viterbi_batch(self._emissions(words)[None], m=k, lattice=True)
        if self.order == 2:
            d = np.stack([x[0] for x in deltas])  # (n, K)
            b = np.stack([x[0] for x in backs])
            b[0] = k  # the position before the first word is <s>
        else:  # (n, K+1, K): previous tag K = <s>, only possible at t = 0
            d = np.full((len(words), k + 1, k), _NEG)
            b = np.full((len(words), k + 1, k), k, dtype=np.int64)
            d[0, k] = deltas[0][0, 0]
            for t in range(1, len(words)):
                d[t, :k] = deltas[t][0]
                b[t, :k] = backs[t][0] if t > 1 else k
        return [self.state_output_[j] for j in tags[0]], d, b

    def _greedy_batch(self, em: np.ndarray) -> np.ndarray:
        """s_t = argmax_s P(s | s_{t-2}, s_{t-1}) P(o_t | s), left to right, batched. em: (B, n, K)."""
        k = len(self.tags_)
        bsz, n, _ = em.shape
        prev2 = np.full(bsz, k)
        prev = np.full(bsz, k)
        out = np.empty((bsz, n), dtype=np.int64)
        for t in range(n):
            trans = self.log_trans_[prev, :k] if self.order == 2 else self.log_trans_[prev2, prev, :k]
            cur = np.argmax(trans + em[:, t], axis=1)
            out[:, t] = cur
            prev2, prev = prev, cur
        return out

    def _beam(self, em: np.ndarray, width: int) -> list[int]:
        """Beam search over states with recombination: each step extends the <= width best states by
        every tag (width * K scores), keeps the best path into each state, then the width best states."""
        k = len(self.tags_)
        n = em.shape[0]
        prev = np.array([k])
        cur = np.array([k])
        score = np.array([0.0])
        history: list[tuple[np.ndarray, np.ndarray]] = []  # per step: (parent hypothesis, tag)
        tag_ids = np.arange(k)
        for t in range(n):
            trans = (self.log_trans_[cur[:, None], tag_ids[None, :]] if self.order == 2
                     else self.log_trans_[prev[:, None], cur[:, None], tag_ids[None, :]])
            cand = (score[:, None] + trans + em[t][None, :]).ravel()  # (h * K,)
            parent = np.repeat(np.arange(len(score)), k)
            new = np.tile(tag_ids, len(score))
            key = new if self.order == 2 else cur[parent] * (k + 1) + new
            order = np.argsort(-cand, kind="stable")
            _, first = np.unique(key[order], return_index=True)  # best hypothesis of each state
            keep = order[first]
            keep = keep[np.argsort(-cand[keep], kind="stable")][:width]
            history.append((parent[keep], new[keep]))
            prev, cur, score = cur[parent[keep]], new[keep], cand[keep]
        end = self.log_trans_[cur, k] if self.order == 2 else self.log_trans_[prev, cur, k]
        h = int(np.argmax(score + end))
        path = []
        for parents, tags in reversed(history):
            path.append(int(tags[h]))
            h = int(parents[h])
        return path[::-1]

    # ------------------------------------------------------------------ textbook MLE tables

    def initial_probs(self) -> np.ndarray:
        """pi(s) = Count(<s>, s) / #sentences, (K,)."""
        k = len(self.tags_)
        return self.bigram_counts_[k, :k] / self.bigram_counts_[k].sum()

    def transition_probs(self) -> np.ndarray:
        """P(s_i | s_{i-1}) = Count(s_{i-1}, s_i) / Count(s_{i-1}), (K, K+1), last column </s>."""
        k = len(self.tags_)
        with np.errstate(invalid="ignore"):
            return self.bigram_counts_[:k] / self.tag_counts_[:, None]

    def emission_probs(self) -> np.ndarray:
        """P(o | s) = Count(s, o) / Count(s), (V, K), rows in `vocab_` order."""
        return self.emission_counts_ / self.tag_counts_[None, :]

    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path) -> None:
        """Write config.json and Parquet tables: initial, transitions (bigram), trigrams, emissions,
        suffixes, unknown_lr (coefficients of the logistic regression, `<bias>` rows the intercepts)."""
        self._check_fitted()
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        k = len(self.tags_)
        names = self.tags_ + [BOS]
        outs = self.tags_ + [EOS]
        pi = self.initial_probs()
        pl.DataFrame({"tag": self.tags_, "count": self.bigram_counts_[k, :k], "prob": pi}).write_parquet(
            d / "initial.parquet")
        pr, cu = np.nonzero(self.bigram_counts_)
        ctx = np.concatenate([self.tag_counts_, [self.bigram_counts_[k].sum()]])
        pl.DataFrame({
            "prev": [names[i] for i in pr], "tag": [outs[j] for j in cu],
            "count": self.bigram_counts_[pr, cu], "prob": self.bigram_counts_[pr, cu] / ctx[pr],
        }).write_parquet(d / "transitions.parquet")
        a, b, c = np.nonzero(self.trigram_counts_)
        pl.DataFrame({
            "prev2": [names[i] for i in a], "prev": [names[i] for i in b], "tag": [outs[j] for j in c],
            "count": self.trigram_counts_[a, b, c],
            "prob": self.trigram_counts_[a, b, c] / self.trigram_counts_.sum(axis=2)[a, b],
        }).write_parquet(d / "trigrams.parquet")
        wr, tc = np.nonzero(self.emission_counts_)
        words = list(self.vocab_)
        pl.DataFrame({
            "word_id": wr, "word": [words[i] for i in wr], "tag": [self.tags_[j] for j in tc],
            "count": self.emission_counts_[wr, tc], "prob": self.emission_counts_[wr, tc] / self.tag_counts_[tc],
        }).write_parquet(d / "emissions.parquet")
        s_rows = [(cased, suf, self.tags_[j], float(v)) for (cased, suf), vec in self.suffix_counts_.items()
                  for j, v in enumerate(vec) if v]
        pl.DataFrame(s_rows, schema={"capitalised": pl.Boolean, "suffix": pl.String, "tag": pl.String,
                                     "count": pl.Float64}, orient="row").write_parquet(d / "suffixes.parquet")
        fr, fc = np.nonzero(self.lr_weights_)
        pl.DataFrame({
            "feature": [self.lr_features_[i] for i in fr] + ["<bias>"] * k,
            "tag": [self.tags_[j] for j in fc] + self.tags_,
            "weight": np.concatenate([self.lr_weights_[fr, fc], self.lr_bias_]),
        }).write_parquet(d / "unknown_lr.parquet")
        config = {
            "format_version": FORMAT_VERSION, "model": "HMMTagger", "params": self.get_params(),
            "tags": self.tags_, "state_output": self.state_output_, "lr_features": self.lr_features_,
            "calibration": self.calibration_,
            "lambdas": self.lambdas_.tolist(), "theta": self.theta_,
            "dev_accuracy": getattr(self, "dev_accuracy_", None),
        }
        (d / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))

    @classmethod
    def load(cls, directory: str | Path) -> HMMTagger:
        """Rebuild a tagger written by `save` (exactly: same tables, same tags)."""
        d = Path(directory)
        try:
            config = json.loads((d / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{d / 'config.json'}: cannot read the tagger config ({e}); "
                             "save a tagger there first") from e
        if config.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{d}: tagger format {config.get('format_version')} is not {FORMAT_VERSION}; retrain")
        self = cls(**config["params"])
        tags = config["tags"]
        k = len(tags)
        tid = {t: i for i, t in enumerate(tags)}
        prev_id = {**tid, BOS: k}
        out_id = {**tid, EOS: k}
        self.tags_ = tags
        self.state_output_ = config["state_output"]

        def read(name: str) -> pl.DataFrame:
            try:
                return pl.read_parquet(d / name)
            except (OSError, pl.exceptions.PolarsError) as e:  # a damaged artifact: one line, not a traceback
                why = "missing" if isinstance(e, FileNotFoundError) else " ".join(str(e).split())
                raise InputError(f"{d / name}: cannot read the tagger table ({why}); the tagger artifact is "
                                 "damaged, run `lexiflow artifacts verify`") from None

        tr = read("transitions.parquet")
        self.bigram_counts_ = np.zeros((k + 1, k + 1))
        self.bigram_counts_[[prev_id[t] for t in tr["prev"]], [out_id[t] for t in tr["tag"]]] = tr["count"].to_numpy()
        tri = read("trigrams.parquet")
        self.trigram_counts_ = np.zeros((k + 1, k + 1, k + 1))
        self.trigram_counts_[[prev_id[t] for t in tri["prev2"]], [prev_id[t] for t in tri["prev"]],
                             [out_id[t] for t in tri["tag"]]] = tri["count"].to_numpy()
        em = read("emissions.parquet")
        vocab: dict[str, int] = {}
        for wid, w in zip(em["word_id"].to_list(), em["word"].to_list(), strict=True):
            vocab.setdefault(w, wid)
        self.vocab_ = dict(sorted(vocab.items(), key=lambda kv: kv[1]))
        self.emission_counts_ = np.zeros((len(vocab), k))
        self.emission_counts_[em["word_id"].to_numpy(), [tid[t] for t in em["tag"]]] = em["count"].to_numpy()
        self.suffix_counts_ = {}
        sf = read("suffixes.parquet")
        for cased, suf, t, c in sf.iter_rows():
            vec = self.suffix_counts_.setdefault((cased, suf), np.zeros(k))
            vec[tid[t]] = c
        self.lr_features_ = config["lr_features"]
        fidx = {f: i for i, f in enumerate(self.lr_features_)}
        lr = read("unknown_lr.parquet")
        self.lr_weights_ = np.zeros((len(self.lr_features_), k))
        self.lr_bias_ = np.zeros(k)
        for f, t, wgt in lr.iter_rows():
            if f == "<bias>":
                self.lr_bias_[tid[t]] = wgt
            else:
                self.lr_weights_[fidx[f], tid[t]] = wgt
        # artifacts saved before these existed: Bayes' rule, no case-variant backoff
        self.calibration_ = {"prior_weight": 1.0, "case_mix": 0.0}
        self.calibration_.update({key: float(v) for key, v in config["calibration"].items()})
        if config.get("dev_accuracy") is not None:
            self.dev_accuracy_ = config["dev_accuracy"]
        self._finalize()
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "tags_"):
            raise ParameterError("HMMTagger is not fitted: call fit(sentences) or HMMTagger.load(dir) first")


# ----------------------------------------------------------------------------------------------
# helpers


def _csr(index_rows: list[list[int]], n_cols: int) -> sp.csr_matrix:
    indptr = np.cumsum([0] + [len(r) for r in index_rows])
    indices = np.fromiter((j for r in index_rows for j in r), dtype=np.int64, count=int(indptr[-1]))
    return sp.csr_matrix((np.ones(len(indices)), indices, indptr), shape=(len(index_rows), n_cols))


def _validate_tagged(sentences: Iterable[Sequence[tuple[str, ...]]], name: str) -> list[list[tuple[str, str, str]]]:
    """(word, tag) pairs or (word, tag, refinement) triples -> (word, tag, state) triples; empty sentences dropped."""
    out = []
    for n, s in enumerate(sentences):
        items = []
        for item in s:
            if (not isinstance(item, tuple | list) or len(item) not in (2, 3)
                    or not all(isinstance(x, str) for x in item)):
                raise InputError(f"{name}[{n}]: expected (word, tag) string pairs (or (word, tag, refinement)), "
                                 f"got {item!r}")
            items.append((item[0], item[1], item[1] if len(item) == 2 else f"{item[1]}|{item[2]}"))
        if items:
            out.append(items)
    return out


def _validate_words(sentences: Sequence[Sequence[str]]) -> list[list[str]]:
    if isinstance(sentences, str):
        raise InputError("tag_many: expected a list of tokenised sentences (lists of words), got a string")
    out = []
    for n, s in enumerate(sentences):
        if isinstance(s, str):
            raise InputError(f"sentences[{n}]: expected a list of words, got a string; tokenise it or use tag_text")
        words = list(s)
        for w in words:
            if not isinstance(w, str):
                raise InputError(f"sentences[{n}]: words must be strings, got {w!r}")
        out.append(words)
    return out


__all__ = ["HMMTagger", "case_class", "word_shape"]
