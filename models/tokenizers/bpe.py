"""Byte-pair encoding (BPE) for subwords, as taught: Sennrich, Haddow & Birch (2016), "Neural Machine
Translation of Rare Words with Subword Units" (after Gage 1994); Jurafsky & Martin, SLP3 ch. 2.

Training starts from the characters of each word type plus an end-of-word marker and repeatedly
merges the most frequent adjacent pair, recording merges in order, until `vocab_size` tokens exist
(special tokens and the initial alphabet included, as in Hugging Face) or no pair occurs
`min_frequency` times. Encoding applies the learned merges in rank order to each word, so the
frequencies of new text never change how it is tokenized.

The marker (`end_of_word`) is Sennrich et al.'s `</w>` by default: the word pre-tokenizer never puts
it inside a word (`<`, `/`, `>` are words of their own), so every word decodes back. A marker that can
occur inside words, such as `_` (a word character: `my_var`), still works, but such words are
ambiguous: an inner `_` decodes as a word end (`my var`), and in `glued` placement the merge `y _`
makes the same token as a word-final `y`.

Marker placement:
- `separate`: the marker is its own symbol after the last character (`l o w </w>`), as in the textbook;
- `glued`: the marker is attached to the last character (`l o w</w>`), as Hugging Face's
  `end_of_word_suffix`; with `pretokenizer="whitespace"` our merges equal `BpeTrainer`'s.

Tie rule: the highest pair count wins; among equal counts the pair with the smaller
`(left id, right id)` wins. Ids: special tokens first, then the characters in code-point order (the
`separate` marker sorts among them as a string), then (glued) the marker-suffixed characters in
code-point order, then merged tokens in creation order. This is Hugging Face's order (its suffixed
characters come in hash order; that never decided a tie in our WikiText check).

Training is incremental (as in Hugging Face's trainer): a pair -> count map, a pair -> words index
and a max-heap with lazy deletion. A merge touches only the words that contain its pair; counts
change by +-word count at each neighbour; stale heap entries are re-pushed with their current
count when they surface. No full recount per merge.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from typing import Annotated, Any, Literal

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
from pydantic import Field

PAIR_BASE = 1 << 24  # pair key = left * PAIR_BASE + right: an int key hashes faster than a tuple and sorts the same


def words_to_symbols(
    words: list[str], alphabet_ids: dict[str, int], final_ids: dict[str, int] | None, marker_id: int | None,
) -> list[list[int]]:
    """Initial symbol ids of each word (vectorized over the concatenated code points)."""
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    cps = np.frombuffer("".join(words).encode("utf-32-le"), dtype=np.uint32)
    uniq, inverse = np.unique(cps, return_inverse=True)
    chars = [chr(c) for c in uniq.tolist()]
    plain = np.array([alphabet_ids[c] for c in chars], dtype=np.int64)
    ids = plain[inverse]
    ends = np.cumsum(lens)
    if final_ids is not None:
        last = ends - 1
        finals = np.array([final_ids.get(c, -1) for c in chars], dtype=np.int64)
        ids[last] = finals[inverse[last]]
    flat = ids.tolist()
    starts = (ends - lens).tolist()
    ends_l = ends.tolist()
    if marker_id is None:
        return [flat[s:e] for s, e in zip(starts, ends_l, strict=True)]
    return [flat[s:e] + [marker_id] for s, e in zip(starts, ends_l, strict=True)]


def initial_pairs(words: list[list[int]], counts: np.ndarray) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Count adjacent pairs over all words (numpy) and index which words contain each pair."""
    lens = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    flat = np.fromiter((i for w in words for i in w), dtype=np.int64, count=int(lens.sum()))
    word_of = np.repeat(np.arange(len(words), dtype=np.int64), lens)
    same = word_of[:-1] == word_of[1:]
    keys = (flat[:-1] * PAIR_BASE + flat[1:])[same]
    owner = word_of[:-1][same]
    if not len(keys):  # every word is one symbol (one-character words, glued marker): nothing to merge
        return {}, {}
    # one sort by (key, word) gives both the counts per key and the deduplicated word lists
    order = np.lexsort((owner, keys))
    keys, owner = keys[order], owner[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    totals = np.add.reduceat(counts[owner], starts)
    first = np.concatenate([[True], (keys[1:] != keys[:-1]) | (owner[1:] != owner[:-1])])
    u_keys, u_owner = keys[first], owner[first]
    u_starts = np.flatnonzero(np.concatenate([[True], u_keys[1:] != u_keys[:-1]]))
    pair_count = dict(zip(keys[starts].tolist(), totals.tolist(), strict=True))
    owners = u_owner.tolist()
    bounds = [*u_starts.tolist(), len(owners)]
    pair_words = {k: owners[bounds[g]:bounds[g + 1]] for g, k in enumerate(u_keys[u_starts].tolist())}
    return pair_count, pair_words


def train_merges(
    words: list[list[int]], counts: list[int], strings: list[str], vocab_size: int, min_frequency: int,
) -> list[tuple[int, int, int, int]]:
    """The BPE merge loop: returns (left, right, new, count) per merge; `words` and `strings` are
    updated in place (final segmentation, new token strings)."""
    pair_count, pair_words = initial_pairs(words, np.asarray(counts, dtype=np.int64))
    heap = [(-c, k) for k, c in pair_count.items()]
    heapq.heapify(heap)
    str_to_id = {s: i for i, s in enumerate(strings)}
    merges: list[tuple[int, int, int, int]] = []
    pop, push = heapq.heappop, heapq.heappush
    with Progress("bpe merges", total=max(vocab_size - len(strings), 1), unit="merges") as progress:
        while len(str_to_id) < vocab_size and heap:
            negc, key = pop(heap)
            c = pair_count.get(key, 0)
            if c != -negc:  # stale entry: counts only fall, so re-file it under its current count
                if c > 0:
                    push(heap, (-c, key))
                continue
            if c < min_frequency:
                break
            a, b = divmod(key, PAIR_BASE)
            s = strings[a] + strings[b]
            new = str_to_id.get(s)
            if new is None:  # a string can be formed twice (a+bc, ab+c): reuse its id, like HF
                new = len(strings)
                strings.append(s)
                str_to_id[s] = new
            merges.append((a, b, new, c))
            touched: set[int] = set()
            new_s = new * PAIR_BASE
            get, words_of = pair_count.get, pair_words.setdefault
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
                        if j > 0:  # left neighbour p: (p, a) -> (p, new)
                            p = w[j - 1]
                            pair_count[p * PAIR_BASE + a] -= cw
                            k = p * PAIR_BASE + new
                            pair_count[k] = get(k, 0) + cw
                            words_of(k, []).append(i)
                            touched.add(k)
                        if j + 2 < len(w):  # right neighbour q: (b, q) -> (new, q)
                            q = w[j + 2]
                            pair_count[b * PAIR_BASE + q] -= cw
                            k = new_s + q
                            pair_count[k] = get(k, 0) + cw
                            words_of(k, []).append(i)
                            touched.add(k)
                        w[j] = new
                        del w[j + 1]
                    j += 1
            pair_count.pop(key, None)
            for k in touched:
                ck = pair_count[k]
                if ck > 0:
                    push(heap, (-ck, k))
            progress.update()
    return merges


class BPE(SubwordTokenizer):
    """BPE tokenizer (Sennrich et al. 2016) with an end-of-word marker, `separate` or `glued`.

    >>> bpe = BPE(vocab_size=300).fit(["low lower lowest newer wider new"])
    """

    kind = "bpe"

    def __init__(
        self,
        vocab_size: VocabSize = 8000,
        end_of_word: Annotated[str, Field(
            min_length=1, max_length=8, pattern=r"^[^\s\x1c-\x1f]+$",  # no space (str.isspace), as fit checks
            description="BPE end-of-word marker (Sennrich et al.'s </w>). Pick one the word pre-tokenizer never "
                        "puts inside a word: with _ a word such as my_var decodes as 'my var'.")] = "</w>",
        marker: Annotated[Literal["glued", "separate"], Field(
            description="BPE marker placement: glued to the last character (exportable to tokenizer.json) or a "
                        "separate symbol (as in textbook exercises).")] = "glued",
        special_tokens: Iterable[str] = DEFAULT_SPECIALS,
        unk_token: str | None = None,
        pretokenizer: str = "word",
        min_frequency: MinFrequency = 2,
    ) -> None:
        super().__init__(vocab_size, tuple(special_tokens), unk_token, pretokenizer, min_frequency)
        self.end_of_word = end_of_word
        self.marker = marker

    def _check_params(self) -> None:
        super()._check_params()
        if self.marker not in ("separate", "glued"):
            raise ParameterError(f"marker={self.marker!r}: choose 'separate' or 'glued'")
        if not isinstance(self.end_of_word, str) or not self.end_of_word or any(c.isspace() for c in self.end_of_word):
            raise ParameterError(f"end_of_word={self.end_of_word!r}: use a non-empty string without spaces, "
                                 "e.g. '</w>'")

    # ---- training ---------------------------------------------------------------------------
    def fit(self, texts: Iterable[str] | pl.Series) -> BPE:
        """Learn merges from a corpus (an iterable of texts, or a polars Series of str)."""
        self._check_params()
        wc = count_words(texts, self._pattern)
        words, counts = wc["word"].to_list(), wc["count"].to_list()
        eow = self.end_of_word
        if wc["word"].str.contains(eow, literal=True).any():
            log.warning("bpe: the end-of-word marker %r occurs inside words; decode cannot tell it apart", eow)
        chars = sorted({c for w in words for c in w} | ({eow} if self.marker == "separate" else set()))
        specials = list(self._specials)
        strings = specials + [c for c in chars if c not in specials]
        alphabet_ids = {s: i for i, s in enumerate(strings)}
        final_ids = marker_id = None
        if self.marker == "glued":
            finals = sorted({w[-1] for w in words})
            final_ids = {}
            for c in finals:
                final_ids[c] = alphabet_ids.get(c + eow, len(strings))
                if final_ids[c] == len(strings):
                    strings.append(c + eow)
        else:
            marker_id = alphabet_ids[eow]
        n_initial = len(strings)
        symbols = words_to_symbols(words, alphabet_ids, final_ids, marker_id)
        merges = train_merges(symbols, counts, strings, self.vocab_size, self.min_frequency)
        log.info("bpe: %d word types, %d initial symbols, %d merges", len(words), n_initial, len(merges))
        self._set_vocab(strings)
        self.merges_ = [(strings[a], strings[b]) for a, b, _, _ in merges]
        self.merge_counts_ = [c for *_, c in merges]
        self.merge_scores_ = [float(c) for c in self.merge_counts_]
        self.counts_ = token_counts(len(strings), symbols, counts)
        self._build_encoder()
        # the training words' final segmentation is their encoding (merges were applied in rank order)
        self._cache.update(zip(words, map(tuple, symbols), strict=True))
        return self

    # ---- encoding ---------------------------------------------------------------------------
    def _build_encoder(self) -> None:
        eow, t2i = self.end_of_word, self.token_to_id_
        self._ranks = {}
        for r, (a, b) in enumerate(self.merges_):
            key = t2i[a] * PAIR_BASE + t2i[b]
            if key not in self._ranks:
                self._ranks[key] = (r, t2i[a + b])
        self._char_ids = {t: i for t, i in t2i.items() if len(t) == 1 and i >= len(self._specials)}
        self._final_ids = ({t[: -len(eow)]: i for t, i in t2i.items() if len(t) == len(eow) + 1 and t.endswith(eow)}
                           if self.marker == "glued" else {})
        self._marker_id = t2i.get(eow) if self.marker == "separate" else None

    def _after_restore(self, config: dict[str, Any]) -> None:
        self._build_encoder()

    def _encode_word(self, word: str) -> list[int]:
        unk, chars = self.unk_id, self._char_ids
        if self.marker == "glued":
            ids = [chars.get(c, unk) for c in word[:-1]]
            ids.append(self._final_ids.get(word[-1], unk))
        else:
            ids = [chars.get(c, unk) for c in word]
            ids.append(self._marker_id if self._marker_id is not None else unk)
        ranks = self._ranks
        while len(ids) > 1:
            best = None
            for j in range(len(ids) - 1):
                m = ranks.get(ids[j] * PAIR_BASE + ids[j + 1])
                if m is not None and (best is None or m[0] < best[0]):
                    best = m
                    a, b = ids[j], ids[j + 1]
            if best is None:
                break
            new = best[1]
            j = 0
            while j < len(ids) - 1:  # all occurrences, left to right (as in training)
                if ids[j] == a and ids[j + 1] == b:
                    ids[j] = new
                    del ids[j + 1]
                j += 1
        return ids

    def _decode_tokens(self, tokens: list[str]) -> str:
        eow, n = self.end_of_word, len(self.end_of_word)
        out = []
        for t in tokens:
            out.append(t[:-n] + " " if t.endswith(eow) else t)
        return "".join(out).rstrip(" ")

    # ---- export ------------------------------------------------------------------------------
    def to_hf_json(self) -> str:
        """Hugging Face `tokenizer.json` (BPE model with `end_of_word_suffix`, `BPEDecoder`).

        Only the `glued` placement has an equivalent there; `separate` raises ParameterError.
        """
        self._check_fitted()
        if self.marker != "glued":
            raise ParameterError(
                "marker='separate' has no Hugging Face equivalent (HF can only glue the end-of-word suffix); "
                "use marker='glued' for a tokenizer.json export"
            )
        doc = self._hf_common()
        doc["decoder"] = {"type": "BPEDecoder", "suffix": self.end_of_word}
        doc["model"] = {
            "type": "BPE", "dropout": None, "unk_token": self._specials[self.unk_id],
            "continuing_subword_prefix": None, "end_of_word_suffix": self.end_of_word,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": self.token_to_id_, "merges": [[a, b] for a, b in self.merges_],
        }
        return json.dumps(doc, ensure_ascii=False)

    def _hf_exportable(self) -> bool:
        return self.marker == "glued"
