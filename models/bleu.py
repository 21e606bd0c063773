"""BLEU (Papineni et al. 2002; notes 004 "BLEU Score") and chrF (Popović 2015), corpus level, written to
give exactly sacreBLEU's numbers (Post 2018) with its defaults: 13a tokenisation, N = 4, 'exp' smoothing.

    p_n  = Σ_segments clipped matching n-grams / Σ_segments candidate n-grams       (modified precision)
           (clipped: an n-gram counts at most as often as it appears in any one reference)
    BP   = 1 if c >= r else exp(1 - r/c)     c = candidate tokens, r = Σ closest reference lengths
    BLEU = 100 · BP · exp((1/N) Σ_n log p_n)

Counts are summed over the corpus before dividing (corpus BLEU is not the mean of sentence BLEUs).
'exp' smoothing (mteval-v13a): the k-th order with no match gets p_n = 1 / (2^k · total_n) instead of 0,
except that no unigram match at all is a score of 0.

References are given as sacrebleu takes them: one list per reference *set* (stream), each as long as the
hypotheses; a None entry means that segment has fewer references.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from lexiflow.models.errors import ParameterError

MAX_ORDER = 4

# mteval-v13a's language-dependent rules (Western languages), applied to " line "
_13A_RULES = [
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),  # punctuation and symbols become tokens
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # period and comma, unless preceded by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # ... unless followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # a dash after a digit
]


@lru_cache(maxsize=2**16)
def tokenize_13a(line: str) -> str:
    """mteval-v13a tokenisation, as WMT and sacreBLEU's default use it: tokens joined by single spaces."""
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    line = f" {line} "
    for pattern, repl in _13A_RULES:
        line = pattern.sub(repl, line)
    return " ".join(line.split())


def _ngrams(tokens: list[str], max_order: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for n in range(1, max_order + 1) for i in range(len(tokens) - n + 1))


def _closest_length(hyp_len: int, ref_lens: list[int]) -> int:
    """The reference length closest to the hypothesis length, the shorter one on a tie (-1 with no reference,
    as sacreBLEU)."""
    return min(ref_lens, key=lambda r: (abs(hyp_len - r), r)) if ref_lens else -1


def _segments(hypotheses: Sequence[str], references: Sequence[Sequence[str | None]]) -> list[tuple[str, list[str]]]:
    if isinstance(hypotheses, str) or not all(isinstance(h, str) for h in hypotheses):
        raise ParameterError("hypotheses: give a list of strings, one per segment")
    if not references or isinstance(references[0], str):
        raise ParameterError("references: give a list of reference streams (one list of strings per reference "
                             "set), e.g. [refs] for a single reference per segment")
    for i, stream in enumerate(references):
        if len(stream) != len(hypotheses):
            raise ParameterError(f"references[{i}] has {len(stream)} segments, hypotheses have {len(hypotheses)}: "
                                 "each reference stream must be line-aligned with the hypotheses")
    per_segment = zip(*references, strict=True)
    return [(h, [r for r in refs if r is not None]) for h, refs in zip(hypotheses, per_segment, strict=True)]


@dataclass(frozen=True)
class BLEUScore:
    score: float  # 0-100
    precisions: list[float]  # p_1..p_N in percent (smoothed as used in the score)
    bp: float
    sys_len: int
    ref_len: int
    counts: list[int]  # clipped matches per order
    totals: list[int]  # candidate n-grams per order

    def __str__(self) -> str:
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"BLEU = {self.score:.2f} {p} (BP = {self.bp:.3f} ratio = {self.sys_len / max(self.ref_len, 1):.3f} "
                f"hyp_len = {self.sys_len} ref_len = {self.ref_len})")


def bleu_from_counts(counts: Sequence[int], totals: Sequence[int], sys_len: int, ref_len: int) -> BLEUScore:
    """BLEU from the corpus sufficient statistics (with 'exp' smoothing, as sacreBLEU's default)."""
    order = len(counts)
    bp = 1.0 if sys_len >= ref_len else (math.exp(1 - ref_len / sys_len) if sys_len > 0 else 0.0)
    precisions = [0.0] * order
    if not any(counts):
        return BLEUScore(0.0, precisions, bp, sys_len, ref_len, list(counts), list(totals))
    smooth = 1.0
    for n in range(order):
        if totals[n] == 0:
            break  # no candidate n-grams of this order (all segments shorter): its precision stays 0
        if counts[n] == 0:
            smooth *= 2
            precisions[n] = 100.0 / (smooth * totals[n])
        else:
            precisions[n] = 100.0 * counts[n] / totals[n]
    # log 0 is floored to -9999999999 (sacreBLEU's my_log): exp of it is 0.0
    log_sum = sum(math.log(p) if p > 0 else -9999999999 for p in precisions)
    return BLEUScore(bp * math.exp(log_sum / order), precisions, bp, sys_len, ref_len, list(counts), list(totals))


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str | None]], tokenize: bool = True,
                lowercase: bool = False, max_order: int = MAX_ORDER) -> BLEUScore:
    """Corpus BLEU of `hypotheses` against reference streams; equal to `sacrebleu.corpus_bleu` (13a).
    tokenize=False scores already tokenised text (whitespace-split), as sacreBLEU's tokenize='none'."""
    counts, totals = [0] * max_order, [0] * max_order
    sys_len = ref_len = 0

    def prep(s: str) -> list[str]:
        s = s.lower() if lowercase else s
        return (tokenize_13a(s.rstrip()) if tokenize else s.rstrip()).split()

    for hyp, refs in _segments(hypotheses, references):
        ref_ngrams: Counter = Counter()
        ref_lens = []
        for ref in refs:
            toks = prep(ref)
            ref_lens.append(len(toks))
            ref_ngrams |= _ngrams(toks, max_order)  # max count over the references (clipping bound)
        toks = prep(hyp)
        sys_len += len(toks)
        ref_len += _closest_length(len(toks), ref_lens)
        for gram, c in _ngrams(toks, max_order).items():
            n = len(gram) - 1
            totals[n] += c
            counts[n] += min(c, ref_ngrams[gram])
    return bleu_from_counts(counts, totals, sys_len, ref_len)


def _char_ngrams(text: str, order: int) -> list[Counter]:
    s = "".join(text.split())  # whitespace is not part of chrF's character n-grams
    return [Counter(s[i:i + n] for i in range(len(s) - n + 1)) for n in range(1, order + 1)]


def _chrf_stats(hyp: list[Counter], ref: list[Counter]) -> list[int]:
    out = []
    for h, r in zip(hyp, ref, strict=True):
        out += [sum(h.values()) if r else 0, sum(r.values()), sum(min(c, r[g]) for g, c in h.items())]
    return out


def _chrf_score(stats: Sequence[int], beta: float) -> float:
    """F_beta of the averaged character n-gram precision and recall over the orders both sides have."""
    factor = beta**2
    precs, recs = [], []
    for i in range(0, len(stats), 3):
        n_hyp, n_ref, n_match = stats[i:i + 3]
        if n_hyp > 0 and n_ref > 0:
            precs.append(n_match / n_hyp)
            recs.append(n_match / n_ref)
    if not precs:
        return 0.0
    p, r = sum(precs) / len(precs), sum(recs) / len(recs)
    return 100 * (1 + factor) * p * r / (factor * p + r) if p + r else 0.0


def corpus_chrf(hypotheses: Sequence[str], references: Sequence[Sequence[str | None]], char_order: int = 6,
                beta: float = 2.0) -> float:
    """Corpus chrF (character 6-grams, β = 2), equal to `sacrebleu.corpus_chrf(...).score`: per segment the
    reference with the best F counts; counts are summed over the corpus."""
    total = [0] * (3 * char_order)
    for hyp, refs in _segments(hypotheses, references):
        h = _char_ngrams(hyp, char_order)
        best, best_f = [0] * (3 * char_order), -1.0
        for ref in refs:
            stats = _chrf_stats(h, _char_ngrams(ref, char_order))
            f = _chrf_score(stats, beta)
            if f > best_f:
                best, best_f = stats, f
        total = [a + b for a, b in zip(total, best, strict=True)]
    return _chrf_score(total, beta)
