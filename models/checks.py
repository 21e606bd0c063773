"""Release checks: what quality means for each artifact kind, judged on figures alone.

Each kind is declared once below: its thresholds (a dataclass whose annotated fields are the pipeline's
`checks` section, `tasks/params.py`) and its rule, a function of the candidate's figures (its manifest's
metrics, plus the measurements `MEASURED` names, which tasks/checks.py takes from the data) and of the
figures of the version currently released under the same name; with nothing released (a first build),
absolute floors. A check that cannot be measured (a metric that is None or NaN) fails: a release
decision is never made on a missing figure.

Why each default is what it is: docs/operations.md, "Release checks".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import polars as pl
from lexiflow.models.text import CONTROL
from pydantic import Field

# Characters a cleaned corpus should not hold: U+FFFD (text decoded with the wrong encoding upstream),
# private-use and unassigned code points, and controls (cleaning removes them; counted to prove it).
ODD_CHARACTERS = r"[\x{FFFD}\p{Co}\p{Cn}]|" + CONTROL
HELD_OUT = ("valid", "test")


@dataclass(frozen=True)
class Result:
    """One check of one artifact: the figure, the released version's figure (None: nothing released),
    the limit it had to meet, the rule in words, and whether it passed and blocks a release."""

    artifact: str  # the run's name for it: corpus, embeddings.svd's evaluation.svd, lm.ngram ...
    check: str  # the figure: tokens, ws353_spearman, valid_word_perplexity ...
    value: float | None
    released: float | None
    limit: float
    rule: str
    passed: bool
    blocking: bool = True
    low: float | None = None  # a range's bounds (`within`); `limit` is then the one the value is nearest
    high: float | None = None

    @property
    def bounds(self) -> str:
        """The limit as people read it, 4 significant digits: one number, or a range's both bounds."""
        if self.low is not None and self.high is not None:
            return f"[{self.low:.4g}, {self.high:.4g}]"
        return "–" if _missing(self.limit) else f"{self.limit:.4g}"

    @property
    def name(self) -> str:
        return f"{self.artifact}.{self.check}"

    def line(self) -> str:
        """`lm.ngram.valid_word_perplexity 412.3 fails ≤ released 362.1 × (1 + 0.05) = 380.2`."""
        shown = "not measured" if _missing(self.value) else f"{self.value:.4g}"
        return f"{self.name} {shown} {'meets' if self.passed else 'fails'} {self.rule}"

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def at_least(artifact: str, check: str, value: Any, released: Any, delta: float, floor: float) -> Result:
    """value ≥ released − delta; with nothing released, value ≥ floor."""
    first = _missing(released)
    limit = floor if first else released - delta
    rule = f"≥ floor {floor:.4g}" if first else f"≥ released {released:.4g} − {delta:.4g} = {limit:.4g}"
    return Result(artifact, check, value, None if first else released, limit, rule,
                  not _missing(value) and value >= limit)


def at_most_ratio(artifact: str, check: str, value: Any, released: Any, epsilon: float, ceiling: float,
                  ceiling_rule: str) -> Result:
    """value ≤ released × (1 + epsilon); with nothing released, value ≤ ceiling."""
    first = _missing(released)
    limit = ceiling if first else released * (1 + epsilon)
    rule = ceiling_rule if first else f"≤ released {released:.4g} × (1 + {epsilon:.4g}) = {limit:.4g}"
    return Result(artifact, check, value, None if first else released, limit, rule,
                  not _missing(value) and value <= limit)


def within(artifact: str, check: str, value: Any, released: Any, tolerance: float, floor: float) -> Result:
    """|value / released − 1| ≤ tolerance; with nothing released, value ≥ floor."""
    if _missing(released):
        return at_least(artifact, check, value, None, 0, floor)
    low, high = released * (1 - tolerance), released * (1 + tolerance)
    ok = not _missing(value) and low <= value <= high
    limit = low if not _missing(value) and value < low else high
    rule = f"within ±{tolerance:.0%} of released {released:.4g}: [{low:.4g}, {high:.4g}]"
    return Result(artifact, check, value, released, limit, rule, ok, low=low, high=high)


# ---- corpus ------------------------------------------------------------------------------------
@dataclass
class CorpusChecks:
    corpus_tolerance: Annotated[float, Field(
        gt=0, le=10, description="Corpus documents and tokens may differ from the released corpus by at most this "
                                 "share (0.25: ±25%); a truncated or duplicated source moves them more.")] = 0.25
    corpus_min_documents: Annotated[int, Field(ge=0, description="First release (nothing released yet): at least "
                                                                 "this many documents.")] = 10
    corpus_min_tokens: Annotated[int, Field(ge=0, description="First release: at least this many tokens (words of "
                                                              "the cleaned text).")] = 10_000
    corpus_max_odd_share: Annotated[float, Field(
        ge=0, le=1, description="Most share of the corpus' characters that may be U+FFFD, private-use, unassigned "
                                "or control characters (text decoded with a wrong encoding upstream).")] = 1e-3


def corpus_checks(artifact: str, figures: dict, released: dict | None, t: CorpusChecks) -> list[Result]:
    before = released or {}
    share = figures.get("odd_character_share")
    return [within(artifact, "documents", figures.get("documents"), before.get("documents"), t.corpus_tolerance,
                   t.corpus_min_documents),
            within(artifact, "tokens", figures.get("tokens"), before.get("tokens"), t.corpus_tolerance,
                   t.corpus_min_tokens),
            Result(artifact, "odd_character_share", share, before.get("odd_character_share"), t.corpus_max_odd_share,
                   f"≤ {t.corpus_max_odd_share:.4g}", not _missing(share) and share <= t.corpus_max_odd_share)]


def odd_character_counts(texts: pl.Series) -> tuple[int, int]:
    """(odd characters, characters) of some texts (see ODD_CHARACTERS)."""
    odd = texts.str.count_matches(ODD_CHARACTERS).cast(pl.UInt64).sum()
    return int(odd or 0), int(texts.str.len_chars().cast(pl.UInt64).sum() or 0)


# ---- vocabulary: coverage of held-out text ----------------------------------------------------------
@dataclass
class CoverageChecks:
    coverage_delta: Annotated[float, Field(
        ge=0, le=1, description="Share of held-out (valid and test) tokens the vocabulary covers (not <unk>): at "
                                "most this much below the released tokenized corpus'.")] = 0.02
    coverage_floor: Annotated[float, Field(ge=0, le=1, description="First release: at least this held-out "
                                                                   "coverage.")] = 0.8


def coverage_checks(artifact: str, figures: dict, released: dict | None, t: CoverageChecks) -> list[Result]:
    return [at_least(artifact, "held_out_coverage", figures.get("held_out_coverage"),
                     (released or {}).get("held_out_coverage"), t.coverage_delta, t.coverage_floor)]


def held_out_coverage(tokens: dict[str, int], unknown: dict[str, int]) -> float | None:
    """The share of held-out tokens that are not `<unk>`, from the tokens and the unknown tokens per split (the
    tokenized corpus's metrics); None without held-out tokens. `held_out_counts`' share, added up."""
    total = sum(tokens.get(split, 0) for split in HELD_OUT)
    return (total - sum(unknown.get(split, 0) for split in HELD_OUT)) / total if total else None


def held_out_counts(tokens: pl.DataFrame, unk_id: int) -> tuple[int, int]:
    """(covered, all) token ids of the held-out splits' sentences: covered ones are not `unk_id`."""
    ids = tokens.filter(pl.col("split").is_in(HELD_OUT))["ids"].explode().drop_nulls()
    return int((ids != unk_id).sum()), len(ids)


# ---- embeddings (their evaluation) -------------------------------------------------------------------
@dataclass
class EmbeddingChecks:
    similarity_delta: Annotated[float, Field(
        ge=0, le=2, description="WS-353 and SimLex-999 Spearman ρ: at most this much below the released "
                                "embeddings' (of the same method).")] = 0.05
    similarity_floor_z: Annotated[float, Field(
        ge=0, le=20, description="First release: ρ at least this many standard deviations of random vectors' ρ "
                                 "(1/√(n−1) over the n pairs evaluated) above 0.")] = 3.0


SIMILARITY_PAIRS = {"ws353": 353, "simlex999": 999}  # pairs in each set (models/evaluation.py's files)


def embedding_checks(artifact: str, figures: dict, released: dict | None, t: EmbeddingChecks) -> list[Result]:
    results = []
    for name, pairs in SIMILARITY_PAIRS.items():
        oov = figures.get(f"{name}_oov_rate")
        n = pairs * (1 - oov) if not _missing(oov) else 0
        floor = t.similarity_floor_z / math.sqrt(n - 1) if n > 2 else math.inf
        results.append(at_least(artifact, f"{name}_spearman", figures.get(f"{name}_spearman"),
                                (released or {}).get(f"{name}_spearman"), t.similarity_delta, floor))
    return results


# ---- language models ---------------------------------------------------------------------------
@dataclass
class LMChecks:
    perplexity_epsilon: Annotated[float, Field(
        ge=0, le=10, description="Valid perplexity per word: at most released × (1 + this), for the same model "
                                 "kind (per word, so a change of tokenizer compares).")] = 0.05
    perplexity_ceiling: Annotated[float, Field(
        gt=0, le=1, description="First release: valid perplexity (per token) at most this share of the vocabulary "
                                "size (a uniform guess scores the vocabulary size).")] = 0.5


def lm_checks(artifact: str, figures: dict, released: dict | None, t: LMChecks) -> list[Result]:
    if released and not _missing(released.get("valid_word_perplexity")):
        return [at_most_ratio(artifact, "valid_word_perplexity", figures.get("valid_word_perplexity"),
                              released["valid_word_perplexity"], t.perplexity_epsilon, math.inf, "")]
    size = figures.get("vocabulary_size") or 0
    return [at_most_ratio(artifact, "valid_perplexity", figures.get("valid_perplexity"), None, 0,
                          t.perplexity_ceiling * size,
                          f"≤ {t.perplexity_ceiling:.4g} × vocabulary size {size} = {t.perplexity_ceiling * size:.4g}")]


# ---- taggers, translation, fine-tuned classifiers: accuracy-like scores ---------------------------------
@dataclass
class TaggerChecks:
    tagger_delta: Annotated[float, Field(ge=0, le=1, description="Tagger accuracy: at most this much below the "
                                                                 "released tagger's (same kind and tag set).")] = 0.01
    tagger_floor: Annotated[float, Field(ge=0, le=1, description="First release: at least this tagger "
                                                                 "accuracy.")] = 0.8


@dataclass
class Seq2SeqChecks:
    bleu_delta: Annotated[float, Field(ge=0, le=100, description="Translation valid BLEU: at most this many points "
                                                                 "below the released model's.")] = 1.0
    bleu_floor: Annotated[float, Field(ge=0, le=100, description="First release: at least this valid "
                                                                 "BLEU.")] = 1.0


@dataclass
class FineTuneChecks:
    finetuned_delta: Annotated[float, Field(ge=0, le=1, description="Fine-tuned classifier accuracy: at most this "
                                                                    "much below the released one's.")] = 0.02
    finetuned_floor: Annotated[float, Field(ge=0, le=1, description="First release: at least this fine-tuned "
                                                                    "accuracy.")] = 0.3


def _score(metric: str, delta: str, floor: str) -> Callable[[str, dict, dict | None, Any], list[Result]]:
    def rule(artifact: str, figures: dict, released: dict | None, t: Any) -> list[Result]:
        return [at_least(artifact, metric, figures.get(metric), (released or {}).get(metric), getattr(t, delta),
                         getattr(t, floor))]
    return rule


@dataclass(frozen=True)
class KindCheck:
    thresholds: type  # the dataclass of its thresholds (a part of the `checks` section)
    rule: Callable[[str, dict, dict | None, Any], list[Result]]


# What each kind is checked on. Embeddings are checked through their evaluation (WS-353, SimLex live there).
CHECKS: dict[str, KindCheck] = {
    "corpus": KindCheck(CorpusChecks, corpus_checks),
    "tokenized_corpus": KindCheck(CoverageChecks, coverage_checks),
    "evaluation": KindCheck(EmbeddingChecks, embedding_checks),
    "lm": KindCheck(LMChecks, lm_checks),
    "tagger": KindCheck(TaggerChecks, _score("accuracy", "tagger_delta", "tagger_floor")),
    "seq2seq": KindCheck(Seq2SeqChecks, _score("valid_bleu", "bleu_delta", "bleu_floor")),
    "finetuned": KindCheck(FineTuneChecks, _score("accuracy", "finetuned_delta", "finetuned_floor")),
}
# The figures of a kind measured from its data, beyond its manifest's metrics (tasks/checks.py).
MEASURED = {"corpus": ("odd_character_share",), "tokenized_corpus": ("held_out_coverage",)}


def run_checks(kind: str, artifact: str, figures: dict, released: dict | None, thresholds: Any,
               advisory: frozenset[str] = frozenset()) -> list[Result]:
    """The checks of one artifact of `kind` (none for a kind without checks); `advisory` names
    (`artifact.check`, or `kind.check` for every artifact of the kind) report without blocking."""
    if kind not in CHECKS:
        return []
    results = CHECKS[kind].rule(artifact, figures, released, thresholds)
    return [r if r.name not in advisory and f"{kind}.{r.check}" not in advisory else
            Result(**{**asdict(r), "blocking": False}) for r in results]


def blocking_failures(results: list[Result]) -> list[Result]:
    return [r for r in results if r.blocking and not r.passed]


def failure_line(results: list[Result]) -> str:
    """Why a release is refused, in one line: each blocking failure with its numbers."""
    failed = blocking_failures(results)
    return f"release refused, {len(failed)} blocking check(s) failed: " + "; ".join(r.line() for r in failed)


TABLE_COLUMNS = ("passed", "blocking", "check", "value", "released", "limit", "rule")  # the verdict first


def markdown(results: list[Result]) -> list[str]:
    """The checks as a markdown table (the report's section and checks.md)."""
    def cell(value: Any) -> str:
        return "–" if _missing(value) else f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in results:
        lines.append(f"| {'yes' if r.passed else '**no**'} | {'yes' if r.blocking else 'no'} | {r.name} | "
                     f"{cell(r.value)} | {cell(r.released)} | {r.bounds} | {r.rule} |")
    return lines
