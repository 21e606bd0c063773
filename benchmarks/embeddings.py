"""Word embeddings: our GloVe (torch) and our gensim word2vec wrapper, quality and speed.

Corpus (built once, cached in the temp folder): gensim's Wikipedia excerpt (redirects skipped,
markup stripped with `filter_wiki`) + `lee_background.cor` + WikiText-2 validation + the words
of UD EWT train; cleaned with lexiflow's ingestion path (NFC, sentence split, lowercase) and
pre-tokenizer; about 0.9 M tokens. dim 100, window 5, min count 5 for every method.

Rows:
- GloVe WS353 / SimLex-999 Spearman on the full sets (targets >= 0.40 / >= 0.15), beside gensim
  SGNS trained on the same corpus in the same run (the peer); and on the test halves (odd pairs),
  the halves the defaults were NOT tuned on (tuning used the even pairs, see `tune_glove`);
- GloVe throughput on this machine's device: cells/s and corpus words/s (tokens × epochs / s);
- SGNS and CBOW through `models.word2vec.Word2Vec` vs raw `gensim.models.Word2Vec` with the same
  parameters and seed (target: equal within seed noise, measured as raw gensim with another seed).

`python -m benchmarks embeddings` (full) or `--quick` (a 60k-token slice, a few epochs).
"""

from __future__ import annotations

import bz2
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.harness import SHARED_DATA, Row
from models.conllu import read_conllu
from models.text import clean_expr, pretokenize_expr
from models.vocab import Vocabulary

CACHE = Path(tempfile.gettempdir()) / "lexiflow-bench-embeddings"
WIKI = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
DIM, WINDOW, MIN_COUNT = 100, 5, 5
W2V_EPOCHS = 15
logger = logging.getLogger("lexiflow.bench.embeddings")


def raw_texts() -> list[str]:
    """The four sources as a list of raw texts (documents / lines / sentences)."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki
    from gensim.test.utils import datapath

    texts: list[str] = []
    with bz2.open(datapath(WIKI), "rb") as f:
        for _title, text, _pageid in extract_pages(f):
            if text and not text.lstrip().lower().startswith("#redirect"):
                texts.append(filter_wiki(text))
    texts += Path(datapath("lee_background.cor")).read_text(encoding="utf-8").splitlines()
    wikitext = (SHARED_DATA / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines()
    texts += [line for line in wikitext if line.strip() and not line.lstrip().startswith("= ")]
    texts += [" ".join(s.words) for s in read_conllu(SHARED_DATA / "ud-english-ewt" / "en_ewt-ud-train.conllu")]
    return texts


def corpus_path() -> Path:
    """Parquet of sentences (`tokens`: list[str]), built once."""
    path = CACHE / "corpus.parquet"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        frame = (
            pl.DataFrame({"text": raw_texts()})
            .select(clean_expr(pl.col("text"), lowercase=True, sentences=True).str.split("\n"))
            .explode("text")
            .select(pretokenize_expr(pl.col("text")).alias("tokens"))
            .filter(pl.col("tokens").list.len() > 0)
        )
        frame.write_parquet(path, row_group_size=5000)
    return path


def quick_path() -> Path:
    path = CACHE / "corpus-quick.parquet"
    if not path.exists():
        pl.read_parquet(corpus_path()).head(3000).write_parquet(path, row_group_size=1000)
    return path


def prepare(path: Path, window: int = WINDOW):
    """Vocabulary (min count 5), token count and the harmonic co-occurrence matrix of a corpus."""
    from models.cooccurrence import cooccurrence_matrix

    tokens = pl.read_parquet(path)["tokens"]
    vocab = Vocabulary.count(tokens, min_count=MIN_COUNT)
    ids = vocab.encode(tokens)
    flat = ids.explode().to_numpy()
    offsets = np.concatenate(([0], np.cumsum(ids.list.len().to_numpy())))
    matrix = cooccurrence_matrix(flat, offsets, len(vocab), window=window, weighting="harmonic")
    return vocab, len(flat), matrix


def split_eval_files() -> dict[str, Path]:
    """WS353 and SimLex-999 as full sets and as dev (even pairs) / test (odd pairs) halves."""
    from gensim.test.utils import datapath

    out = {}
    for name, source in (("ws353", "wordsim353.tsv"), ("simlex", "simlex999.txt")):
        lines = Path(datapath(source)).read_text(encoding="utf-8").splitlines()
        header = [ln for ln in lines if ln.startswith("#")]
        pairs = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
        out[name] = Path(datapath(source))
        for half, part in (("dev", pairs[0::2]), ("test", pairs[1::2])):
            path = CACHE / f"{name}-{half}.txt"
            path.write_text("\n".join(header + part) + "\n", encoding="utf-8")
            out[f"{name}-{half}"] = path
    return out


def evaluate(vectors: np.ndarray, tokens: list[str], sets: dict[str, Path]) -> dict[str, float]:
    """Spearman rho per evaluation set, through gensim KeyedVectors (zero rows left out)."""
    from gensim.models import KeyedVectors

    keep = np.flatnonzero(np.abs(vectors).sum(1) > 0)
    kv = KeyedVectors(vectors.shape[1])
    kv.add_vectors([tokens[i] for i in keep], vectors[keep])
    return {name: _spearman(kv, path) for name, path in sets.items()}


def _spearman(kv, path: Path) -> float:
    delimiter = "\t"
    return float(kv.evaluate_word_pairs(str(path), delimiter=delimiter, restrict_vocab=len(kv))[1].statistic)


def train_glove(matrix, **params):
    from models.glove import GloVe

    return GloVe(dim=DIM, **params).fit(matrix)


def tune_glove(grid: list[dict], path: Path | None = None) -> pl.DataFrame:
    """Score GloVe settings on the dev halves (even pairs) only; returns one row per setting."""
    vocab, n_tokens, matrix = prepare(path or corpus_path())
    sets = {k: v for k, v in split_eval_files().items() if k.endswith("-dev")}
    rows = []
    for params in grid:
        start = time.perf_counter()
        model = train_glove(matrix, **params)
        scores = evaluate(model.vectors_, vocab.tokens, sets)
        rows.append({**params, **scores, "final_loss": model.history_[-1]["loss"],
                     "seconds": time.perf_counter() - start})
        print(rows[-1], flush=True)
    return pl.DataFrame(rows)


def run(quick: bool) -> list[Row]:
    raise NotImplementedError
