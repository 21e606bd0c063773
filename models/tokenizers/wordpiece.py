"""WordPiece, as taught: Schuster & Nakajima (2012), "Japanese and Korean Voice Search"; Wu et al.
(2016), Google's NMT system; the Hugging Face course's WordPiece chapter.

Training: each word starts as its first character plus `##`-prefixed continuation characters
(`hug` -> `h ##u ##g`). Each step merges the adjacent pair with the highest likelihood score
`count(ab) / (count(a) * count(b))` (not the raw pair frequency), recording merges in order, until
`vocab_size` tokens exist or no pair occurs `min_frequency` times. `a + ##b` makes `ab`
(`##a + ##b` makes `##ab`).

Tie rule: the highest score wins (scores compared as float64 quotients, so equal fractions tie);
among equal scores the smaller `(left id, right id)` wins. Ids: special tokens, then the initial
units sorted by their string (code-point order, so `##x` units come before letters), then merged
tokens in creation order.

Encoding is greedy longest-match-first (BERT): the longest vocabulary entry that starts the word,
then the longest `##` entry that continues it, and so on; a word that cannot be covered, or has
more than `max_input_chars_per_word` characters, becomes the unknown token as a whole.

Note: Hugging Face's `WordPieceTrainer` trains with plain BPE frequency; this class implements the
score (tests show a corpus where the two pick different merges).

Training is incremental: pair counts, a pair -> words index and unit counts are updated only in
the words that contain the merged pair. A merge lowers count(a) and count(b), which raises the
score of every pair that contains a or b, so those pairs (found through a unit -> pairs index) are
re-filed in a versioned heap; entries with an old version are skipped when they surface.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl
from lexiflow.models.errors import ParameterError
from lexiflow.models.progress import Progress
from lexiflow.models.tokenizers.base import (
    DEFAULT_SPECIALS,
    MinFrequency,
    SubwordTokenizer,
    VocabSize,
    count_words,
    log,
    token_counts,
)
from lexiflow.models.tokenizers.bpe import PAIR_BASE, initial_pairs, words_to_symbols


def train_wordpiece(
    words: list[list[int]], counts: list[int], strings: list[str], prefix: str, vocab_size: int, min_frequency: int,
) -> list[tuple[int, int, int, int, float]]:
    """The WordPiece merge loop: (left, right, new, count, score) per merge; `words`/`strings` updated in place."""
    cnt = np.asarray(counts, dtype=np.int64)
    pair_count, pair_words = initial_pairs(words, cnt)
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    flat = np.fromiter((i for w in words for i in w), dtype=np.int64, count=int(lens.sum()))
    unit_count: list[int] = np.bincount(flat, weights=np.repeat(cnt, lens), minlength=len(strings)).astype(
        np.int64).tolist()
    unit_pairs: dict[int, set[int]] = {}
    for k in pair_count:
        a, b = divmod(k, PAIR_BASE)
        unit_pairs.setdefault(a, set()).add(k)
        unit_pairs.setdefault(b, set()).add(k)
    version: dict[int, int] = dict.fromkeys(pair_count, 0)

    def score(k: int) -> float:
        a, b = divmod(k, PAIR_BASE)
        return pair_count[k] / (unit_count[a] * unit_count[b])

    heap = [(-score(k), k, 0) for k in pair_count]
    heapq.heapify(heap)
    str_to_id = {s: i for i, s in enumerate(strings)}
    merges: list[tuple[int, int, int, int, float]] = []
    pop, push, n_prefix = heapq.heappop, heapq.heappush, len(prefix)
    with Progress("wordpiece merges", total=max(vocab_size - len(strings), 1), unit="merges") as progress:
        while len(str_to_id) < vocab_size and heap:
            negs, key, ver = pop(heap)
            if version.get(key) != ver:
                continue  # superseded by a newer entry (or the pair is gone)
            c = pair_count[key]
            if c < min_frequency:
                continue  # too rare to merge; its count can only fall, so drop it for good
            a, b = divmod(key, PAIR_BASE)
            right = strings[b]
            s = strings[a] + (right[n_prefix:] if right.startswith(prefix) else right)
            new = str_to_id.get(s)
            if new is None:
                new = len(strings)
                strings.append(s)
                str_to_id[s] = new
                unit_count.append(0)
            merges.append((a, b, new, c, -negs))
            new_s = new * PAIR_BASE
            for i in pair_words.pop(key, ()):
                w = words[i]
                cw = counts[i]
                j = 0
                while True:
                    try:
                        j = w.index(a, j)
                    except ValueError:
                        break
                    if j + 1 < len(w) and w[j + 1] == b:
                        unit_count[a] -= cw
                        unit_count[b] -= cw
                        unit_count[new] += cw
                        if j > 0:
                            p = w[j - 1]
                            pair_count[p * PAIR_BASE + a] -= cw
                            k = p * PAIR_BASE + new
                            if k not in pair_count:
                                pair_count[k] = 0
                                unit_pairs.setdefault(p, set()).add(k)
                                unit_pairs.setdefault(new, set()).add(k)
                            pair_count[k] += cw
                            pair_words.setdefault(k, []).append(i)
                        if j + 2 < len(w):
                            q = w[j + 2]
                            pair_count[b * PAIR_BASE + q] -= cw
                            k = new_s + q
                            if k not in pair_count:
                                pair_count[k] = 0
                                unit_pairs.setdefault(new, set()).add(k)
                                unit_pairs.setdefault(q, set()).add(k)
                            pair_count[k] += cw
                            pair_words.setdefault(k, []).append(i)
                        w[j] = new
                        del w[j + 1]
                    j += 1
            pair_count[key] = 0
            # scores changed exactly for the pairs that contain a, b or new: re-file them
            touched = unit_pairs.get(a, set()) | unit_pairs.get(b, set()) | unit_pairs.get(new, set())
            for k in touched:
                if pair_count[k] <= 0:
                    del pair_count[k]
                    version.pop(k, None)
                    pair_words.pop(k, None)
                    left, right_id = divmod(k, PAIR_BASE)
                    unit_pairs[left].discard(k)
                    unit_pairs[right_id].discard(k)
                else:
                    version[k] = version.get(k, -1) + 1
                    push(heap, (-score(k), k, version[k]))
            if len(heap) > 4 * len(pair_count) + 1024:  # drop superseded entries now and then
                heap = [e for e in heap if version.get(e[1]) == e[2]]
                heapq.heapify(heap)
            progress.update()
    return merges


class WordPiece(SubwordTokenizer):
    """WordPiece tokenizer: likelihood-score training, greedy longest-match-first encoding."""

    kind = "wordpiece"

    def __init__(
        self,
        vocab_size: VocabSize = 8000,
        prefix: str = "##",
        special_tokens: Iterable[str] = DEFAULT_SPECIALS,
        unk_token: str | None = None,
        pretokenizer: str = "word",
        min_frequency: MinFrequency = 2,
        max_input_chars_per_word: int = 100,
    ) -> None:
        super().__init__(vocab_size, tuple(special_tokens), unk_token, pretokenizer, min_frequency)
        self.prefix = prefix
        self.max_input_chars_per_word = max_input_chars_per_word

    def _check_params(self) -> None:
        super()._check_params()
        if not isinstance(self.prefix, str) or not self.prefix or any(c.isspace() for c in self.prefix):
            raise ParameterError(f"prefix={self.prefix!r}: use a non-empty string without spaces, e.g. '##'")
        if not isinstance(self.max_input_chars_per_word, int) or self.max_input_chars_per_word < 1:
            raise ParameterError(f"max_input_chars_per_word={self.max_input_chars_per_word!r}: use an integer >= 1")

    def fit(self, texts: Iterable[str] | pl.Series) -> WordPiece:
        """Learn the vocabulary from a corpus (an iterable of texts, or a polars Series of str)."""
        self._check_params()
        wc = count_words(texts, self._pattern)
        words, counts = wc["word"].to_list(), wc["count"].to_list()
        if wc["word"].str.starts_with(self.prefix).any():
            log.warning("wordpiece: some words start with the prefix %r; decode cannot tell them apart", self.prefix)
        firsts = {w[0] for w in words}
        conts = {c for w in words for c in w[1:]}
        units = sorted(firsts | {self.prefix + c for c in conts})
        specials = list(self._specials)
        strings = specials + [u for u in units if u not in specials]
        ids = {s: i for i, s in enumerate(strings)}
        first_ids = {c: ids[c] for c in firsts}
        cont_ids = {c: ids[self.prefix + c] for c in conts}
        # the first character uses the plain unit, the rest the ## unit: symbols of w[0] + w[1:]
        heads = words_to_symbols([w[0] for w in words], first_ids, None, None)
        tails = words_to_symbols([w[1:] for w in words if len(w) > 1], cont_ids, None, None)
        it = iter(tails)
        symbols = [h + next(it) if len(w) > 1 else h for w, h in zip(words, heads, strict=True)]
        n_initial = len(strings)
        merges = train_wordpiece(symbols, counts, strings, self.prefix, self.vocab_size, self.min_frequency)
        log.info("wordpiece: %d word types, %d initial units, %d merges", len(words), n_initial, len(merges))
        self._set_vocab(strings)
        self.merges_ = [(strings[a], strings[b]) for a, b, *_ in merges]
        self.merge_counts_ = [m[3] for m in merges]
        self.merge_scores_ = [m[4] for m in merges]
        self.counts_ = token_counts(len(strings), symbols, counts)
        self._after_restore({})
        return self

    def _after_restore(self, config: dict[str, Any]) -> None:
        n = len(self.prefix)
        self._max_len = max((len(t) - (n if t.startswith(self.prefix) else 0) for t in self.vocab_), default=1)

    def _encode_word(self, word: str) -> list[int]:
        """Greedy longest-match-first (BERT's WordpieceTokenizer)."""
        unk, t2i, prefix, max_len = self.unk_id, self.token_to_id_, self.prefix, self._max_len
        n = len(word)
        if n > self.max_input_chars_per_word:
            return [unk]
        out, start = [], 0
        while start < n:
            end = min(n, start + max_len)
            while end > start:
                i = t2i.get(word[start:end] if start == 0 else prefix + word[start:end])
                if i is not None:
                    break
                end -= 1
            else:
                return [unk]
            out.append(i)
            start = end
        return out

    def _decode_tokens(self, tokens: list[str]) -> str:
        n, out = len(self.prefix), []
        for t in tokens:
            if t.startswith(self.prefix) and out:
                out.append(t[n:])
            else:
                out.append((" " if out else "") + t)
        return "".join(out)

    def to_hf_json(self) -> str:
        """Hugging Face `tokenizer.json` (WordPiece model and decoder)."""
        self._check_fitted()
        doc = self._hf_common()
        doc["decoder"] = {"type": "WordPiece", "prefix": self.prefix, "cleanup": False}
        doc["model"] = {"type": "WordPiece", "unk_token": self._specials[self.unk_id],
                        "continuing_subword_prefix": self.prefix,
                        "max_input_chars_per_word": self.max_input_chars_per_word, "vocab": self.token_to_id_}
        return json.dumps(doc, ensure_ascii=False)
