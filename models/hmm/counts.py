"""Counts and smoothing: the states, the tag n-gram and (word, tag) counts, and the interpolated
transition table decoding uses (SLP3 ch. 8; Brants 2000, TnT)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
from lexiflow.models.errors import InputError
from lexiflow.models.progress import Progress

BOS, EOS = "<s>", "</s>"


def log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x)


def validate_tagged(sentences: Iterable[Sequence[tuple[str, ...]]], name: str) -> list[list[tuple[str, str, str]]]:
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


def lexicalize(triples: list[list[tuple[str, str, str]]], n: int) -> list[list[tuple[str, str, str]]]:
    """The n most frequent words seen with more than one state get states of their own, `state|word`."""
    if n <= 0:
        return triples
    freq = Counter(w for s in triples for w, _, _ in s)
    seen: dict[str, set[str]] = defaultdict(set)
    for s in triples:
        for w, _, st in s:
            seen[w].add(st)
    lex = {w for w, _ in sorted(((w, c) for w, c in freq.items() if len(seen[w]) > 1),
                               key=lambda wc: (-wc[1], wc[0]))[:n]}
    return [[(w, t, f"{st}|{w}" if w in lex else st) for w, t, st in s] for s in triples]


def count(sents: list[list[tuple[str, str]]], tags: list[str]) -> tuple[np.ndarray, np.ndarray, dict, np.ndarray]:
    """Bigram counts (K+1, K+1) [prev, cur] (row K = <s>, column K = </s>), trigram counts (K+1,)*3
    [prev2, prev, cur], the vocabulary {word: row} and emission counts (V, K) of (word, state) sentences."""
    tid = {t: i for i, t in enumerate(tags)}
    k = len(tags)
    c2 = np.zeros((k + 1, k + 1))
    c3 = np.zeros((k + 1, k + 1, k + 1))
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
    return c2, c3, vocab, emit


def deleted_interpolation(c2: np.ndarray, c3: np.ndarray, order: int) -> np.ndarray:
    """Brants (2000), fig. 1: each n-gram votes, with its count, for the order whose estimate
    (leaving this occurrence out) is largest. Returns the weights (unigram, bigram[, trigram])."""
    k = len(c2) - 1
    outcome = c2.sum(axis=0)
    ctx = np.concatenate([c2[:k, :].sum(axis=1), [c2[k, :].sum()]])
    pair = c3.sum(axis=2)
    n = outcome.sum()
    lam = np.zeros(order)

    def frac(a: float, b: float) -> float:
        return (a - 1) / (b - 1) if b > 1 else 0.0

    if order == 2:
        for j, t in zip(*np.nonzero(c2), strict=True):
            est = [frac(outcome[t], n), frac(c2[j, t], ctx[j])]
            lam[int(np.argmax(est))] += c2[j, t]
    else:
        for i, j, t in zip(*np.nonzero(c3), strict=True):
            est = [frac(outcome[t], n), frac(c2[j, t], ctx[j]), frac(c3[i, j, t], pair[i, j])]
            lam[int(np.argmax(est))] += c3[i, j, t]
    return lam / lam.sum()


def log_transitions(c2: np.ndarray, c3: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """log P(cur | prev[, prev2]) interpolated with weights lam (unigram, bigram[, trigram]):
    (K+1, K+1[, K+1]), first axes previous states (K = <s>), last axis K = </s>. The order is len(lam)."""
    k = len(c2) - 1
    ctx = np.concatenate([c2[:k, :].sum(axis=1), [c2[k, :].sum()]])  # Count(prev), <s> included
    outcome = c2.sum(axis=0)  # occurrences as an outcome, </s> included
    p1 = outcome / outcome.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        p2 = np.where(ctx[:, None] > 0, c2 / ctx[:, None], 0.0)
        pair = c3.sum(axis=2)  # Count(prev2, prev) as a history; (<s>, <s>) = #sentences
        p3 = np.where(pair[:, :, None] > 0, c3 / pair[:, :, None], 0.0)
    if len(lam) == 2:
        return log(lam[0] * p1[None, :] + lam[1] * p2)
    return log(lam[0] * p1[None, None, :] + lam[1] * p2[None, :, :] + lam[2] * p3)
