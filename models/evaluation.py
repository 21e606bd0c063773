"""Intrinsic evaluation of word vectors: similarity, analogies, nearest neighbours.

- Word similarity: Spearman ρ between cosine similarity and human judgements on WordSim-353 and
  SimLex-999, over the pairs whose words are both in the vocabulary; the OOV rate says how many
  pairs were left out (gensim's `evaluate_word_pairs`, so figures compare with published ones).
- Analogies (Mikolov et al. 2013, the Google set): a : b :: c : ? answered by
  3CosAdd  argmax_x cos(x, b) − cos(x, a) + cos(x, c)   and
  3CosMul  argmax_x cos'(x, b) · cos'(x, c) / (cos'(x, a) + ε),  cos' = (cos + 1) / 2, ε = 1e-3
  (Levy & Goldberg 2014), over the `restrict_vocab` most frequent words, excluding a, b, c.
  Accuracy counts the questions whose four words are all in that vocabulary; coverage is their
  share of all questions. Vectorized in batches (gensim loops per question).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from lexiflow.models.progress import Progress

if TYPE_CHECKING:  # gensim is imported where its files are read: the pipeline's sections read DEFAULT_PROBES only
    from gensim.models import KeyedVectors

SIMILARITY_SETS = {"ws353": "wordsim353.tsv", "simlex999": "simlex999.txt"}
ANALOGY_SET = "questions-words.txt"
DEFAULT_PROBES = ("king", "france", "computer", "music", "war", "city", "water", "science", "red", "good")


@dataclass
class AnalogyResult:
    add_accuracy: float
    mul_accuracy: float
    coverage: float
    questions: int
    covered: int
    sections: pl.DataFrame  # section, questions, covered, add_accuracy, mul_accuracy


def word_similarity(kv: KeyedVectors, dataset: str) -> dict[str, float]:
    from gensim.test.utils import datapath

    path = datapath(SIMILARITY_SETS.get(dataset, dataset))
    try:
        pearson, spearman, oov = kv.evaluate_word_pairs(path, restrict_vocab=len(kv), case_insensitive=True)
    except ValueError:  # gensim's answer when no pair is in the vocabulary
        return {"spearman": float("nan"), "pearson": float("nan"), "oov_rate": 1.0}
    return {"spearman": float(spearman.statistic), "pearson": float(pearson.statistic), "oov_rate": oov / 100}


def read_analogies(path: str | None = None) -> pl.DataFrame:
    """The Google analogy file as (section, a, b, c, d), lowercased."""
    from gensim.test.utils import datapath

    rows, section = [], ""
    with open(path or datapath(ANALOGY_SET), encoding="utf-8") as f:
        for line in f:
            if line.startswith(":"):
                section = line[1:].strip()
            elif line.strip():
                rows.append([section, *line.lower().split()])
    return pl.DataFrame(rows, schema=["section", "a", "b", "c", "d"], orient="row")


def analogies(kv: KeyedVectors, restrict_vocab: int = 30_000, questions: pl.DataFrame | None = None,
              batch: int = 256, progress: Callable[[float | None], None] | None = None) -> AnalogyResult:
    """3CosAdd and 3CosMul accuracy over the covered questions, in batches (progress: questions/s, ETA)."""
    questions = read_analogies() if questions is None else questions
    words = kv.index_to_key[:restrict_vocab]
    index = {w.lower(): i for i, w in reversed(list(enumerate(words)))}  # first (most frequent) wins
    unit = kv.get_normed_vectors()[: len(words)]
    ids = np.array([[index.get(w, -1) for w in (a, b, c, d)]
                    for a, b, c, d in questions.select("a", "b", "c", "d").iter_rows()], dtype=np.int64)
    covered = np.flatnonzero((ids >= 0).all(axis=1)) if len(ids) else np.empty(0, np.int64)
    add_ok = np.zeros(len(ids), bool)
    mul_ok = np.zeros(len(ids), bool)
    bar = Progress("evaluation.analogies", total=len(covered), unit="questions", callback=progress)
    for start in range(0, len(covered), batch):
        bar.update(min(batch, len(covered) - start))
        q = ids[covered[start:start + batch]]
        cos_a, cos_b, cos_c = (unit[q[:, k]] @ unit.T for k in range(3))  # (B, V) each
        add = cos_b - cos_a + cos_c
        mul = ((cos_b + 1) / 2) * ((cos_c + 1) / 2) / ((cos_a + 1) / 2 + 1e-3)
        rows = np.arange(len(q))[:, None]
        for scores, ok in ((add, add_ok), (mul, mul_ok)):
            scores[rows, q[:, :3]] = -np.inf
            ok[covered[start:start + batch]] = scores.argmax(axis=1) == q[:, 3]
    bar.close()
    is_cov = np.zeros(len(ids), bool)
    is_cov[covered] = True
    per = questions.with_columns(covered=pl.Series(is_cov), add=pl.Series(add_ok), mul=pl.Series(mul_ok))
    sections = per.group_by("section", maintain_order=True).agg(
        questions=pl.len(), covered=pl.col("covered").sum(),
        add_accuracy=pl.col("add").sum() / pl.col("covered").sum(),
        mul_accuracy=pl.col("mul").sum() / pl.col("covered").sum(),
    )
    n_cov = len(covered) or np.nan  # no covered question: no accuracy (shown as "–"), not 0 %
    return AnalogyResult(
        add_accuracy=float(add_ok.sum() / n_cov), mul_accuracy=float(mul_ok.sum() / n_cov),
        coverage=len(covered) / max(len(ids), 1), questions=len(ids), covered=len(covered), sections=sections,
    )


def nearest_neighbours(kv: KeyedVectors, probes: tuple[str, ...] | list[str] = DEFAULT_PROBES,
                       k: int = 8) -> pl.DataFrame:
    """Top-k neighbours by cosine of each probe word found in the vocabulary."""
    rows = []
    for probe in probes:
        if probe in kv.key_to_index:
            for rank, (word, sim) in enumerate(kv.most_similar(probe, topn=k), start=1):
                rows.append({"probe": probe, "rank": rank, "neighbour": word, "cosine": float(sim)})
    schema = {"probe": pl.String, "rank": pl.Int64, "neighbour": pl.String, "cosine": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def evaluate(kv: KeyedVectors, restrict_vocab: int = 30_000, probes=DEFAULT_PROBES,
             progress: Callable[[float | None], None] | None = None) -> dict:
    """All intrinsic metrics of one set of vectors, as flat metrics plus tables (the analogies, nearly all
    the time, report progress)."""
    ws = word_similarity(kv, "ws353")
    sl = word_similarity(kv, "simlex999")
    an = analogies(kv, restrict_vocab, progress=progress)
    metrics = {
        "ws353_spearman": ws["spearman"], "ws353_oov_rate": ws["oov_rate"],
        "simlex999_spearman": sl["spearman"], "simlex999_oov_rate": sl["oov_rate"],
        "analogy_add_accuracy": an.add_accuracy, "analogy_mul_accuracy": an.mul_accuracy,
        "analogy_coverage": an.coverage, "analogy_questions_covered": an.covered,
        "vocabulary": len(kv),
    }
    return {"metrics": metrics, "analogy_sections": an.sections, "neighbours": nearest_neighbours(kv, probes)}


def report_markdown(title: str, results: dict[str, dict]) -> str:
    """A markdown report comparing several embeddings (name -> `evaluate` output)."""
    cols = [("ws353_spearman", "WS353 ρ"), ("ws353_oov_rate", "WS353 OOV"),
            ("simlex999_spearman", "SimLex ρ"), ("simlex999_oov_rate", "SimLex OOV"),
            ("analogy_add_accuracy", "analogy 3CosAdd"), ("analogy_mul_accuracy", "analogy 3CosMul"),
            ("analogy_coverage", "analogy coverage"), ("vocabulary", "vocabulary")]
    lines = [f"# {title}", "", "| embeddings | " + " | ".join(c[1] for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for name, res in results.items():
        m = res["metrics"]
        lines.append(f"| {name} | " + " | ".join(format_cell(m[c[0]]) for c in cols) + " |")
    for name, res in results.items():
        lines += ["", f"## Nearest neighbours — {name}", ""]
        for probe, group in res["neighbours"].group_by("probe", maintain_order=True):
            words = ", ".join(f"{w} ({c:.2f})" for w, c in group.select("neighbour", "cosine").iter_rows())
            lines.append(f"- **{probe[0]}**: {words}")
        lines += ["", f"## Analogy sections — {name}", "", "| section | covered/questions | 3CosAdd | 3CosMul |",
                  "|---|---|---|---|"]
        for row in res["analogy_sections"].iter_rows(named=True):
            lines.append(f"| {row['section']} | {row['covered']}/{row['questions']} | "
                         f"{format_cell(row['add_accuracy'])} | {format_cell(row['mul_accuracy'])} |")
    return "\n".join(lines) + "\n"


def format_cell(v) -> str:
    """A figure for the reports: no value (None, NaN) is "–"; manifests write an infinity "Infinity"."""
    if isinstance(v, str) and v in ("Infinity", "-Infinity"):
        v = float(v)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "–"
    return f"{v:.3f}" if isinstance(v, float) else str(v)
