"""word2vec (skip-gram or CBOW with negative sampling) through gensim, on lexiflow's vocabulary.

Mikolov et al. (2013), "Efficient Estimation of Word Representations in Vector Space" (CBOW,
skip-gram) and "Distributed Representations of Words and Phrases and their Compositionality"
(negative sampling with the unigram distribution raised to 3/4, frequent-word subsampling).
Řehůřek & Sojka (2010), gensim, does the training; this wrapper only makes it ours:

- the vocabulary is exactly lexiflow's: gensim's is built from our words and counts
  (`build_vocab_from_freq`), special tokens left out, and inserted so that gensim's order (count
  descending, ties by descending insertion index) equals our id order. gensim index k is our
  id k + 4; the learned `vectors_` is (V × dim) indexed by our ids, specials zero rows;
- the corpus is streamed: `sentences` is any restartable iterable of token lists, read once to
  count sentences and words (for gensim's learning-rate schedule) and once per epoch. With the
  same counts, parameters and seed and `workers=1`, the vectors are bit-identical to
  `gensim.models.Word2Vec(sentences, ...)` (where its vocabulary has the same order: no ties);
- per-epoch metrics through a gensim callback: loss (gensim's `compute_loss`, the epoch's share of
  `get_latest_training_loss()`), seconds, raw corpus words/s.

Streaming a corpus from Parquet (no list of lists in memory)::

    sentences = ParquetSentences("corpus/documents.parquet", column="tokens")  # or a text column
    vocab = Vocabulary.count(pl.read_parquet(path, columns=["tokens"])["tokens"], min_count=5)
    model = Word2Vec(sg=True, dim=100, epochs=15, min_count=5).fit(sentences, vocab)
    model.vectors_[vocab_id]  # float32 (dim,)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from gensim.models import KeyedVectors
from gensim.models import Word2Vec as GensimWord2Vec
from gensim.models.callbacks import CallbackAny2Vec
from gensim.models.word2vec_inner import MAX_WORDS_IN_BATCH
from lexiflow.models.errors import InputError
from lexiflow.models.estimator import Estimator
from lexiflow.models.progress import Progress
from lexiflow.models.skipgram import Which, word_vectors
from lexiflow.models.text import pretokenize_expr
from lexiflow.models.vocab import SPECIALS, Vocabulary
from lexiflow.models.word2vec_config import Word2VecConfig

logger = logging.getLogger("lexiflow.word2vec")


class ParquetSentences:
    """A restartable stream of token lists read from Parquet file(s) in record batches.

    `column` holds either token lists (`list[str]`, one sentence per row) or text (`str`): text is
    split into sentences at `\\n` and cut with lexiflow's pre-tokenizer. `split`: only the rows whose
    `split` column holds this value (a corpus artifact's "train"). Only one batch of `batch_rows` rows
    is in memory at a time.
    """

    def __init__(self, paths: str | Path | Sequence[str | Path], column: str = "tokens",
                 batch_rows: int = 10_000, split: str | None = None) -> None:
        self.paths = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
        self.column, self.batch_rows, self.split = column, batch_rows, split
        for path in self.paths:
            if not path.exists():
                raise InputError(f"{path}: Parquet corpus file not found")

    def __iter__(self) -> Iterator[list[str]]:
        import pyarrow.parquet as pq

        for path in self.paths:
            file = pq.ParquetFile(path)
            columns = [self.column] + (["split"] if self.split is not None else [])
            if missing := [c for c in columns if c not in file.schema_arrow.names]:
                raise InputError(f"{path}: no column {missing[0]!r} (columns: {file.schema_arrow.names})")
            for batch in file.iter_batches(batch_size=self.batch_rows, columns=columns):
                frame = pl.from_arrow(batch)
                if self.split is not None:
                    frame = frame.filter(pl.col("split") == self.split)
                series = frame[self.column]
                if series.dtype == pl.String:
                    series = pl.select(pretokenize_expr(series.str.split("\n").explode())).to_series()
                yield from (s for s in series.to_list() if s)




class Word2Vec(Estimator):
    """gensim word2vec estimator on lexiflow's vocabulary: `.fit(sentences, vocab).vectors_`."""

    def __init__(self, sg: bool = True, dim: int = 100, window: int = 5, negative: int = 5, sample: float = 1e-3,
                 epochs: int = 25, ns_exponent: float = 0.75, seed: int = 0, workers: int = 2,
                 min_count: int = 1, vectors: Which = "u") -> None:
        self.sg, self.dim, self.window, self.negative, self.sample = sg, dim, window, negative, sample
        self.epochs, self.ns_exponent, self.seed, self.workers, self.min_count = (
            epochs, ns_exponent, seed, workers, min_count)
        self.vectors = vectors

    @property
    def config(self) -> Word2VecConfig:
        return Word2VecConfig(**self.get_params())

    def gensim_kwargs(self) -> dict[str, Any]:
        """The same settings as `gensim.models.Word2Vec` keyword arguments (for a raw-gensim run)."""
        c = self.config
        return dict(sg=int(c.sg), vector_size=c.dim, window=c.window, negative=c.negative, hs=0, sample=c.sample,
                    epochs=c.epochs, ns_exponent=c.ns_exponent, seed=c.seed, workers=c.workers,
                    min_count=c.min_count, compute_loss=True)

    def fit(self, sentences: Iterable[list[str]], vocabulary: Vocabulary,
            progress: Callable[[float | None], None] | None = None,
            start: tuple[np.ndarray, np.ndarray] | None = None) -> Word2Vec:
        """Train on a restartable iterable of token lists; rows of `vectors_` are `vocabulary` ids. `start`:
        input and output vectors to start from (continued training), rows by `vocabulary` id, NaN rows where
        a word starts as a cold model's do (random input, zero output vectors)."""
        cfg = self.config
        cfg.validate()
        if iter(sentences) is sentences:
            raise InputError("Word2Vec.fit: `sentences` is a one-shot iterator; pass a restartable iterable "
                             "(a list, or a class whose __iter__ re-reads the corpus, e.g. ParquetSentences)")
        tokens, counts = vocabulary.tokens, vocabulary.counts
        n_special = len(SPECIALS)
        if tokens[:n_special] != list(SPECIALS):
            raise InputError("Word2Vec.fit: vocabulary must start with the special tokens " + " ".join(SPECIALS))
        # Our words sort by count descending, so those kept by min_count are ids n_special..n_special+k-1.
        k = int((counts[n_special:] >= cfg.min_count).sum())
        if k == 0:
            raise InputError(f"Word2Vec.fit: no vocabulary word has count >= min_count={cfg.min_count}")
        words = tokens[n_special:n_special + k]
        # Reverse insertion order: gensim breaks count ties by descending insertion index.
        word_freq = {w: int(c) for w, c in zip(reversed(words), reversed(counts[n_special:n_special + k]),
                                                strict=True)}

        sentences = _Pieces(sentences)
        n_sentences = n_words = 0  # one streaming pass: gensim's lr decay runs on the sentence count
        for sentence in sentences:
            n_sentences += 1
            n_words += len(sentence)
        if n_words == 0:
            raise InputError("Word2Vec.fit: the corpus has no tokens")

        model = GensimWord2Vec(**self.gensim_kwargs())
        model.build_vocab_from_freq(word_freq, corpus_count=n_sentences)
        model.corpus_total_words = n_words
        if model.wv.index_to_key != words:  # guards the tie-order assumption above
            raise RuntimeError("gensim vocabulary order differs from lexiflow's ids (gensim version change?)")
        for ours, theirs in zip(start or (), (model.wv.vectors, model.syn1neg), strict=False):
            rows = ours[n_special:n_special + k]
            known = ~np.isnan(rows).any(axis=1)
            theirs[known] = rows[known]

        log = _EpochLog(n_words, Progress("word2vec", total=cfg.epochs * n_words, unit="words", callback=progress))
        model.train(sentences, total_examples=n_sentences, total_words=n_words, epochs=cfg.epochs,
                    compute_loss=True, callbacks=[log])
        log.bar.close()

        # u: the input (center) vectors; v: the output (context) vectors negative sampling trains
        self.input_vectors_, self.output_vectors_ = (np.zeros((len(tokens), cfg.dim), dtype=np.float32)
                                                     for _ in range(2))
        self.input_vectors_[n_special:n_special + k] = model.wv.vectors
        self.output_vectors_[n_special:n_special + k] = model.syn1neg
        vectors = word_vectors(self.input_vectors_, self.output_vectors_, cfg.vectors)
        model.wv.vectors = vectors[n_special:n_special + k]  # a view: the keyed vectors share our rows
        self.vectors_ = vectors
        self.keyed_vectors_: KeyedVectors = model.wv
        self.history_ = log.history
        self.n_sentences_, self.n_words_ = n_sentences, n_words
        return self


class _Pieces:
    """A restartable corpus with every sentence cut into pieces of at most MAX_WORDS_IN_BATCH tokens:
    gensim's compiled training silently ignores the rest of a longer one (as its LineSentence cuts)."""

    def __init__(self, sentences: Iterable[list[str]]) -> None:
        self.sentences = sentences

    def __iter__(self) -> Iterator[list[str]]:
        for sentence in self.sentences:
            if len(sentence) <= MAX_WORDS_IN_BATCH:
                yield sentence
            else:
                yield from (sentence[i:i + MAX_WORDS_IN_BATCH] for i in range(0, len(sentence), MAX_WORDS_IN_BATCH))


class _EpochLog(CallbackAny2Vec):
    """Per-epoch loss (gensim's running loss is cumulative over `train`), seconds, words/s."""

    def __init__(self, n_words: int, bar: Progress) -> None:
        self.n_words, self.bar = n_words, bar
        self.history: list[dict[str, float]] = []
        self.start, self.loss_before = 0.0, 0.0

    def on_epoch_begin(self, model: GensimWord2Vec) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, model: GensimWord2Vec) -> None:
        seconds = time.perf_counter() - self.start
        total = float(model.get_latest_training_loss())
        self.history.append({"epoch": len(self.history) + 1, "loss": total - self.loss_before,
                             "seconds": seconds, "words_per_s": self.n_words / max(seconds, 1e-12)})
        self.loss_before = total
        self.bar.update(self.n_words)

