"""The HMM tagger: fits counts, smoothing and the unknown-word models, calibrates on dev, and tags
with the decoders of `decoding` (see the package docstring for the model)."""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.estimator import Estimator
from lexiflow.models.hmm import calibration, counts, decoding, persistence, probability, unknown
from lexiflow.models.hmm.calibration import Calibration
from lexiflow.models.hmm.counts import log
from lexiflow.models.progress import Progress

logger = logging.getLogger("lexiflow.hmm")

METHODS = ("viterbi", "viterbi_pruned", "greedy", "beam")
UNKNOWN_MODELS = ("suffix", "logreg", "both")


class HMMTagger(Estimator):
    """Supervised HMM tagger (order 2: bigram, order 3: trigram) with a TnT + logistic-regression
    unknown-word model. Parameters are set here and never changed by `fit`; learned state ends in `_`.

    lambdas: transition interpolation weights (unigram, bigram[, trigram]); None = deleted interpolation.
    suffix_length, rare_threshold, theta: TnT's suffix model (longest suffix, words of at most this
      count feed it, the abstraction weight; None = the standard deviation of the tag probabilities).
    unknown: "suffix", "logreg" or "both" (log-linear mix, weight calibrated on dev).
    lr_max_count, lr_C: the logistic regression learns from tokens of words seen at most this often
      in train; its inverse L2 strength.
    rare_max_count: known words seen at most this often mix in the unknown-word model (weight on dev).
    unknown_mix, emission_weight, unknown_weight, rare_mix, prior_weight, case_mix: the calibration values
      (`Calibration`); None = tuned on the `dev` sentences given to `fit` (defaults without dev: 0.5, 1, 1,
      0, 1, 0). The values used are `calibration_`.
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
        params = super().get_params()  # read from __init__ (models/estimator.py)
        params["lambdas"] = None if self.lambdas is None else [float(x) for x in self.lambdas]  # JSON-ready
        return params

    def _fixed_calibration(self) -> dict[str, float | None]:
        """The calibration values given to the constructor (None = tune on dev)."""
        return {name: getattr(self, name) for name in Calibration.names()}

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
        if self.theta is not None and self.theta < 0:
            raise ParameterError(f"theta={self.theta}: must be >= 0 or None")
        calibration.check(self._fixed_calibration())

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
        triples = counts.validate_tagged(sentences, "sentences")
        if not triples:
            raise InputError("fit: no tagged sentence with at least one word; pass (word, tag) pair lists")
        triples = counts.lexicalize(triples, self.lexicalize)
        state_out = {st: t for s in triples for _, t, st in s}
        sents = [[(w, st) for w, _, st in s] for s in triples]
        self.tags_ = sorted(state_out)
        self.state_output_ = [state_out[st] for st in self.tags_]
        self.bigram_counts_, self.trigram_counts_, self.vocab_, self.emission_counts_ = counts.count(sents, self.tags_)
        self.suffix_counts_ = unknown.suffix_counts(self.vocab_, self.emission_counts_, self.suffix_length,
                                                    self.rare_threshold)
        self.lr_features_, self.lr_weights_, self.lr_bias_ = self._fit_logreg(sents)
        self.calibration_ = calibration.initial(self.unknown, self._fixed_calibration())
        self._finalize()
        if dev is not None:
            self._calibrate(counts.validate_tagged(dev, "dev"))
        return self

    def _fit_logreg(self, sents: list[list[tuple[str, str]]]) -> tuple[list[str], np.ndarray, np.ndarray]:
        """P(tag | word features) on the tokens of train's rare words (seen at most lr_max_count times)."""
        k = len(self.tags_)
        if self.unknown == "suffix":
            return [], np.zeros((0, k)), np.zeros(k)
        totals = self.emission_counts_.sum(axis=1)
        tid = {t: i for i, t in enumerate(self.tags_)}
        feat_rows: list[list[str]] = []
        y: list[int] = []
        for s in sents:
            for pos, (w, t) in enumerate(s):
                if totals[self.vocab_[w]] <= self.lr_max_count:
                    feat_rows.append(self._lr_word_features(w, pos == 0))
                    y.append(tid[t])
        return unknown.fit_logreg(feat_rows, y, k, self.lr_C, self.max_iter, self.seed)

    def _lr_word_features(self, word: str, initial: bool) -> list[str]:
        return unknown.lr_word_features(word, initial, self._known_tags)

    def _known_tags(self, word: str) -> list[str]:
        row = self.vocab_.get(word)
        if row is None:
            return []
        return [self.tags_[j] for j in np.flatnonzero(self.emission_counts_[row])]

    def _finalize(self) -> None:
        """Build every decoding table from the counts and coefficients (shared by fit and load)."""
        k = len(self.tags_)
        c2, c3 = self.bigram_counts_, self.trigram_counts_
        self.tag_counts_ = c2[:k, :].sum(axis=1)  # occurrences of each tag (as a predecessor, </s> included)
        if self.lambdas is not None:
            self.lambdas_ = np.asarray([float(x) for x in self.lambdas])
        else:
            self.lambdas_ = counts.deleted_interpolation(c2, c3, self.order)
        self.log_trans_ = counts.log_transitions(c2, c3, self.lambdas_)
        self._trigrams = decoding.sparse_trigrams(self.log_trans_) if self.order == 3 else None
        self._one = decoding.one_sentence_tables(self.log_trans_, self._trigrams)
        self.log_prior_ = log(self.tag_counts_ / self.tag_counts_.sum())  # (K,) log P(t)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.log_emit_ = log(self.emission_counts_ / self.tag_counts_[None, :])  # (V, K)
        self.word_counts_ = self.emission_counts_.sum(axis=1)
        self.theta_ = unknown.default_theta(self.state_output_, self.tag_counts_) if self.theta is None else self.theta
        self.suffix_index_, self.suffix_log_ = unknown.suffix_tables(self.suffix_counts_, k, self.theta_)
        self._lr_index = {f: i for i, f in enumerate(self.lr_features_)}
        # (word, sentence-initial) -> (log P_suffix, log P_lr): independent of the calibration values
        self._unk_cache: dict[tuple[str, bool], tuple[np.ndarray, np.ndarray]] = {}
        self._case_variants: dict[str, list[int]] = defaultdict(list)  # lowercased form -> vocab rows
        for w, row in self.vocab_.items():
            self._case_variants[w.lower()].append(row)
        self._rare_components = None
        self._apply_calibration()

    # ------------------------------------------------------------------ calibration

    def _unknown_components(self, words: Sequence[str], initial: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
        """(log P_suffix(t | w), log P_lr(t | w)), each (n, K), for words treated as unknown."""
        suf = unknown.suffix_scores(words, self.suffix_index_, self.suffix_log_, self.suffix_length)
        if not len(self.lr_features_):
            return suf, suf
        rows = [self._lr_word_features(w, b) for w, b in zip(words, initial, strict=True)]
        return suf, unknown.logreg_scores(rows, self._lr_index, self.lr_weights_, self.lr_bias_)

    def _apply_calibration(self) -> None:
        """Known-word emission table, rare known words mixed with the unknown-word model."""
        table = self.log_emit_.copy()
        mu = self.calibration_.rare_mix
        rare = np.flatnonzero(self.word_counts_ <= self.rare_max_count)
        if mu > 0 and len(rare):
            if self._rare_components is None:  # independent of the calibration values
                words = list(self.vocab_)
                self._rare_components = self._unknown_components([words[r] for r in rare], [False] * len(rare))
            unk = unknown.unknown_scores(*self._rare_components, self.log_prior_, self.calibration_)
            # Same scale as counts: P(w|t) = P(t|w) P(w) / P(t) with P(w) = Count(w) / N.
            log_pw = np.log(self.word_counts_[rare] / self.word_counts_.sum())[:, None]
            with np.errstate(divide="ignore"):
                table[rare] = np.logaddexp(np.log1p(-mu) + table[rare], np.log(mu) + unk + log_pw)
        self._emit_table = table * self.calibration_.emission_weight
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
        grids = {k: v for k, v in calibration.GRIDS.items() if k != "unknown_mix" or self.unknown == "both"}
        free = [key for key in grids if getattr(self, key) is None]

        def score() -> float:
            self._apply_calibration()
            pred = proj[np.concatenate([np.asarray(p, dtype=np.int64) for p in self._tag_ids(words, "viterbi_pruned")])]
            return float(np.mean(pred == gold))

        best = score()
        for _ in range(2):
            changed = False
            for key in free:
                for value in grids[key]:
                    old = self.calibration_
                    if value == getattr(old, key):
                        continue
                    self.calibration_ = dataclasses.replace(old, **{key: value})
                    acc = score()
                    if acc > best + 1e-12:
                        best, changed = acc, True
                        logger.info("hmm.calibrate: %s=%s dev accuracy %.4f", key, value, acc)
                    else:
                        self.calibration_ = old
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
        unknown_rows: dict[tuple[str, bool], int] = {}
        n_known = len(self._emit_table)
        vocab = self.vocab_
        for s in sentences:
            for i, w in enumerate(s):
                row = vocab.get(w)
                if row is None and i == 0 and self.lowercase_initial and w[:1].isupper():
                    row = vocab.get(w.lower())
                if row is None:
                    row = n_known + unknown_rows.setdefault((w, i == 0), len(unknown_rows))
                rows.append(row)
        if not unknown_rows:
            return np.asarray(rows, dtype=np.int64), np.zeros((0, len(self.tags_)))
        keys = list(unknown_rows)
        todo = [key for key in keys if key not in self._unk_cache]
        if todo:
            suf, lr = self._unknown_components([w for w, _ in todo], [b for _, b in todo])
            if len(self._unk_cache) > 500_000:
                self._unk_cache.clear()
            for key, a, b in zip(todo, suf, lr, strict=True):
                self._unk_cache[key] = (a, b)
        suf = np.stack([self._unk_cache[key][0] for key in keys])
        lr = np.stack([self._unk_cache[key][1] for key in keys])
        scores = unknown.unknown_scores(suf, lr, self.log_prior_, self.calibration_)
        mu = self.calibration_.case_mix
        if mu > 0:
            variants = [(i, self.emission_counts_[known].sum(axis=0)) for i, (w, _) in enumerate(keys)
                        if (known := self._case_variants.get(w.lower()))]
            unknown.mix_case_variants(scores, variants, self.tag_counts_, self.word_counts_.sum(), mu)
        return np.asarray(rows, dtype=np.int64), scores * self.calibration_.unknown_weight

    def _known_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of every known word's emission row, cached per (max_candidates, prune)."""
        key = (self.max_candidates, self.prune)
        if self._cand_key != key:
            self._cand = decoding.token_candidates(self._emit_table, self.max_candidates, self.prune)
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

    def states(self, sentences: Sequence[Sequence[str]], method: str = "viterbi",
               beam_width: int = 8) -> list[list[int]]:
        """State ids (indices into `tags_`) of many tokenised sentences: the paths `tag_many` maps to tags."""
        self._check_fitted()
        return self._tag_ids(_validate_words(sentences), method, beam_width)

    def path_score(self, words: Sequence[str], states: Sequence[int]) -> float:
        """The model's log score of one state path: emissions plus transitions from <s> to </s>."""
        self._check_fitted()
        k, order = len(self.tags_), self.order
        em = self._emissions(words)
        seq = [k] * (order - 1) + list(states) + [k]
        return float(sum(em[i, s] for i, s in enumerate(states))
                     + sum(self.log_trans_[tuple(seq[i:i + order])] for i in range(len(states) + 1)))

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
        if len(sentences) == 1 and method in ("viterbi", "viterbi_pruned"):  # one sentence: no batch set-up
            return [self._viterbi_one(sentences[0], exact=method == "viterbi")]
        out: list[list[int]] = [[] for _ in sentences]
        decode = {"viterbi_pruned": lambda em: decoding.viterbi_batch(self.log_trans_, em, self.max_candidates,
                                                                      self.prune),
                  "greedy": lambda em: decoding.greedy(self.log_trans_, em),
                  "beam": lambda em: decoding.beam_batch(self.log_trans_, em, beam_width)}.get(method)
        with Progress("hmm.tag", total=sum(map(len, sentences)), unit="tokens") as prog:
            chunk_start = 0
            while chunk_start < len(sentences):  # chunks of ~50k tokens bound the emission arrays
                chunk_end, n_tok = chunk_start, 0
                while chunk_end < len(sentences) and (n_tok < 50_000 or chunk_end == chunk_start):
                    n_tok += len(sentences[chunk_end])
                    chunk_end += 1
                chunk = sentences[chunk_start:chunk_end]
                if method == "viterbi":
                    out[chunk_start:chunk_end] = self._viterbi_exact_chunk(chunk)
                elif method == "viterbi_pruned" and self.order == 3:
                    out[chunk_start:chunk_end] = self._viterbi_ragged_chunk(chunk)
                else:
                    out[chunk_start:chunk_end] = self._decode_by_length(chunk, decode)
                prog.update(n_tok)
                chunk_start = chunk_end
        return out

    def _decode_by_length(self, chunk: list[list[str]], decode) -> list[list[int]]:
        """Run a batched decoder on groups of equal-length sentences."""
        out: list[list[int]] = [[] for _ in chunk]
        offsets = np.cumsum([0] + [len(s) for s in chunk])
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
                    out[i] = tags.tolist()
        return out

    def _viterbi_one(self, words: list[str], exact: bool) -> list[int]:
        """Viterbi of one sentence with the small dense kernels (the same candidates as the batch)."""
        if not words:
            return []
        rows, unk = self._token_rows([words])
        k_ids, k_sc, k_w = self._exact_candidates() if exact else self._known_candidates()
        if len(unk):
            u_ids, u_sc, u_w = decoding.token_candidates(unk, len(self.tags_) if exact else self.max_candidates,
                                                         None if exact else self.prune)
        n_known = len(k_ids)
        ids, sc = [], []
        for r in rows.tolist():
            if r < n_known:
                ids.append(k_ids[r, :k_w[r]])
                sc.append(k_sc[r, :k_w[r]])
            else:
                u = r - n_known
                ids.append(u_ids[u, :u_w[u]])
                sc.append(u_sc[u, :u_w[u]])
        return decoding.viterbi_one(self._one, ids, sc)

    def _viterbi_ragged_chunk(self, chunk: list[list[str]]) -> list[list[int]]:
        """Pruned trigram Viterbi of a chunk of sentences with the candidate tags of each token."""
        offsets = np.cumsum([0] + [len(s) for s in chunk])
        out: list[list[int]] = [[] for _ in chunk]
        rows, unk = self._token_rows(chunk)
        k_ids, k_sc, k_w = self._known_candidates()
        u_ids, u_sc, u_w = decoding.token_candidates(unk, self.max_candidates, self.prune)
        w = k_ids.shape[1]  # unknown rows are padded/cut to the known rows' width
        if u_ids.shape[1] < w:
            extra = w - u_ids.shape[1]
            u_ids = np.pad(u_ids, ((0, 0), (0, extra)))
            u_sc = np.pad(u_sc, ((0, 0), (0, extra)), constant_values=decoding.NEG)
        ids = np.concatenate([k_ids, u_ids[:, :w]])[rows]
        sc = np.concatenate([k_sc, u_sc[:, :w]])[rows]
        wid = np.concatenate([k_w, np.minimum(u_w, w)])[rows]
        # at most ~4M (prev2, prev, cur) triples per step: few sentences at a time when m is large
        group = max(1, int(4e6 // max(1, ids.shape[1]) ** 3))
        for g0 in range(0, len(chunk), group):
            g1 = min(g0 + group, len(chunk))
            lo, hi = offsets[g0], offsets[g1]
            tagged = decoding.viterbi_ragged(self.log_trans_, ids[lo:hi], sc[lo:hi], wid[lo:hi],
                                             np.diff(offsets[g0:g1 + 1]))
            out[g0:g1] = tagged
        return out

    def _viterbi_exact_chunk(self, chunk: list[list[str]]) -> list[list[int]]:
        """Exact Viterbi of a chunk of sentences over every tag with a finite emission score (the compiled
        per-sentence kernel: faster here than any batched numpy form of the exact search, measured)."""
        live = [i for i, s in enumerate(chunk) if s]
        out: list[list[int]] = [[] for _ in chunk]
        if not live:
            return out
        sents = [chunk[i] for i in live]
        rows, unk = self._token_rows(sents)
        k_ids, k_sc, k_w = self._exact_candidates()
        u_ids, u_sc, u_w = decoding.token_candidates(unk, len(self.tags_), None)
        n_known = len(k_ids)
        known = rows < n_known
        m = max(k_ids.shape[1], u_ids.shape[1])
        ids = np.zeros((len(rows), m), dtype=np.int64)
        sc = np.full((len(rows), m), decoding.NEG)
        wid = np.empty(len(rows), dtype=np.int64)
        ids[known, :k_ids.shape[1]], sc[known, :k_ids.shape[1]], wid[known] = (
            k_ids[rows[known]], k_sc[rows[known]], k_w[rows[known]])
        u = rows[~known] - n_known
        ids[~known, :u_ids.shape[1]], sc[~known, :u_ids.shape[1]], wid[~known] = u_ids[u], u_sc[u], u_w[u]
        tagged = decoding.viterbi_many(self._one, ids, sc, wid, np.asarray([len(s) for s in sents]))
        for i, tags in zip(live, tagged, strict=True):
            out[i] = tags
        return out

    def _exact_candidates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every known word's possible (finite-score) tags, best first, trimmed to the widest; cached."""
        if getattr(self, "_exact_key", None) is not self._emit_table:
            ids, sc, wid = decoding.token_candidates(self._emit_table, len(self.tags_), None)
            m = int(wid.max(initial=1))
            self._exact = (np.ascontiguousarray(ids[:, :m]), np.ascontiguousarray(sc[:, :m]), wid)
            self._exact_key = self._emit_table
        return self._exact

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
        tags, deltas, backs = decoding.viterbi_batch(self.log_trans_, self._emissions(words)[None], k, self.prune,
                                                     lattice=True)
        if self.order == 2:
            d = np.stack([x[0] for x in deltas])  # (n, K)
            b = np.stack([x[0] for x in backs])
            b[0] = k  # the position before the first word is <s>
        else:  # (n, K+1, K): previous tag K = <s>, only possible at t = 0
            d = np.full((len(words), k + 1, k), decoding.NEG)
            b = np.full((len(words), k + 1, k), k, dtype=np.int64)
            d[0, k] = deltas[0][0, 0]
            for t in range(1, len(words)):
                d[t, :k] = deltas[t][0]
                b[t, :k] = backs[t][0] if t > 1 else k
        return [self.state_output_[j] for j in tags[0]], d, b

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

    def _mle_tables(self, words: Sequence[str],
                    end: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(pi, transitions, per-position emissions P(o_t | s), P(</s> | s) or None) from the MLE tables;
        a word never seen in training has emission 0 under every state."""
        self._check_fitted()
        words = _validate_words([words])[0]
        if not words:
            raise InputError("the sentence is empty: give at least one word")
        k, e = len(self.tags_), self.emission_probs()
        em = np.array([e[self.vocab_[w]] if w in self.vocab_ else np.zeros(k) for w in words])
        trans = self.transition_probs()
        return self.initial_probs(), np.nan_to_num(trans[:, :k]), em, (np.nan_to_num(trans[:, k]) if end else None)

    def joint_log_prob(self, words: Sequence[str], tags: Sequence[str], end: bool = False) -> float:
        """log P(S, O) of `words` tagged `tags` under the raw MLE tables (notes 000; `probability`);
        `end` multiplies in P(</s> | s_n). -inf where a factor is 0 (an unseen word or transition)."""
        index = {t: i for i, t in enumerate(self.tags_)}
        unknown_tags = sorted(set(tags) - set(index))
        if unknown_tags:
            raise ParameterError(f"tags {unknown_tags} are not states of this model (states: {self.tags_})")
        tables = self._mle_tables(words, end)
        return probability.joint_log_prob(*tables[:3], [index[t] for t in tags], final=tables[3])

    def forward_log_prob(self, words: Sequence[str], end: bool = False) -> float:
        """log P(O) = log sum over tag sequences of P(S, O) (forward algorithm) under the raw MLE tables."""
        pi, trans, em, final = self._mle_tables(words, end)
        return probability.forward_log_prob(pi, trans, em, final=final)

    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path, prefix: str = "") -> None:
        """Counts and coefficients as Parquet plus config.json (`persistence`), file names starting with
        `prefix` (another model's files may share the folder: an artifact's files are flat)."""
        self._check_fitted()
        persistence.save(self, directory, prefix)

    @classmethod
    def load(cls, directory: str | Path, prefix: str = "") -> HMMTagger:
        """Rebuild a tagger written by `save` (exactly: same tables, same tags)."""
        saved = persistence.read(directory, prefix)
        self = cls(**saved["config"]["params"])
        for name, value in saved["state"].items():
            setattr(self, name, value)
        self.calibration_ = Calibration(**saved["config"]["calibration"])
        self._finalize()
        return self


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
