"""The `checks` stage: each artifact of a run checked against the version released under the same name
(the rules: models/checks.py), the results an artifact of their own.

Why a `checks` artifact and not a field of each checked manifest: a check compares with whatever is
released when it runs, and an artifact's version (and so its manifest) must not depend on release state,
or a release would rebuild everything. The checks artifact's inputs are both sides, the candidates
(`candidates.<name>`) and the released versions (`released.<name>`), so its version is exactly what its
results depend on: the same candidates against the same released versions and thresholds reuse it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl
from lexiflow.models import checks
from lexiflow.models.config import from_section
from lexiflow.models.vocab import UNK_ID
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import read_manifest, read_rows, row_groups
from lexiflow.tasks.params import ChecksParams
from lexiflow.tasks.stage import stage


def _share(ref: ArtifactRef, name: str, count: Callable[[pl.DataFrame], tuple[int, int]]) -> float | None:
    """hits / all of `count(rows)` (hits, all) added up over the file's row groups, read one at a time (a corpus
    may not fit in memory); None when there is nothing to count."""
    hits = total = start = 0
    for rows, _size in row_groups(ref, name):
        part_hits, part_total = count(read_rows(ref, name, start, start + rows))
        hits, total, start = hits + part_hits, total + part_total, start + rows
    return hits / total if total else None


MEASURE: dict[str, Callable[[ArtifactRef], float | None]] = {
    "odd_character_share": lambda ref: _share(ref, "documents.parquet",
                                              lambda rows: checks.odd_character_counts(rows["text"])),
    "held_out_coverage": lambda ref: _share(ref, "tokens.parquet", lambda rows: checks.held_out_counts(rows, UNK_ID)),
}


def figures(ref: ArtifactRef) -> dict[str, Any]:
    """What the checks of `ref`'s kind judge: its manifest's metrics and the figures measured from its data (where
    the metrics lack them: a tokenized corpus records its held-out coverage, one made before measures it)."""
    metrics = read_manifest(ref)["metrics"]
    measured = [name for name in checks.MEASURED.get(ref.kind, ()) if name not in metrics]
    return {**metrics, **{name: MEASURE[name](ref) for name in measured}}


@stage("checks")
def check_artifacts(out: ArtifactWriter, candidates: dict[str, ArtifactRef],
                    released: dict[str, ArtifactRef] | None, params: ChecksParams) -> None:
    """`candidates`: the run's artifacts by name (corpus, evaluation.svd, lm.ngram, ...); `released`: the version
    released under each name, where there is one."""
    released, advisory = released or {}, frozenset(params.advisory)
    results: list[checks.Result] = []
    for name, ref in candidates.items():
        if ref.kind not in checks.CHECKS:
            continue
        before = figures(released[name]) if name in released else None
        thresholds = from_section(checks.CHECKS[ref.kind].thresholds, params)
        results += checks.run_checks(ref.kind, name, figures(ref), before, thresholds, advisory)
    rows = [result.row() for result in results]
    blocking = checks.blocking_failures(results)
    out.write_json("checks.json", rows)
    out.write_text("checks.md", "\n".join(checks.markdown(results)) + "\n")
    out.metrics.update({"checks": len(results), "failed": sum(not r.passed for r in results),
                        "blocking_failures": len(blocking), "passed": not blocking, "results": rows,
                        "compared_with": {name: ref.version for name, ref in released.items()}})
