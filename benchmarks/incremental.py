"""Incremental rebuilds (issue 62; docs/design.md, "Incremental rebuilds"): a folder of plain-text files is
built cold, then changed four times, each change rebuilt in the same store (reusing its pieces) and built from
scratch in a new store: a 1 % append, a 10 % append, one file removed, one file edited. Each stage's time of the
rebuild is reported beside the full build of the same corpus, and the count-based artifacts of the two are
compared (versions and every file's SHA-256).

The stages run as the pipeline's tasks do, without Prefect (`tests/stages.publish`: the builder, its version and
its pieces), on the `parallel` runner given: corpus → tokenizer → tokenized corpus → co-occurrence → PPMI → SVD,
the n-gram LM, then the SVD's evaluation, the checks and the report: the stages of the issue's default command
(`lexiflow run --corpus DIR --set 'embeddings=["svd"]' --set 'lm=["ngram"]'`).

Options (`--option KEY=VALUE`): `files` (10), `file_mb` (3.0: MB of each file), `runner` (threads), `workers` (2),
`dim` (300: SVD dimensions), `svd_warm` (1: the rebuilds' SVD warm-started from the last build's; the full
builds find none and run cold). The issue's sizes:

    python -m benchmarks incremental                                   # 30 MB in 10 files
    python -m benchmarks incremental --option files=10 --option file_mb=30   # 300 MB in 10 files
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path

from lexiflow.storage import ArtifactStore
from lexiflow.tasks.checks import check_artifacts
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.embeddings import svd_embeddings
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.lm import train_lm
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.params import (
    ChecksParams,
    CooccurrenceParams,
    CorpusParams,
    EvaluationParams,
    NgramParams,
    ParallelParams,
    PPMIParams,
    SVDParams,
    VocabularyParams,
)
from lexiflow.tasks.report import write_report
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from benchmarks.corpora import WIKITEXT_VALID
from benchmarks.harness import Row
from tests.stages import publish

COUNT_BASED = ("corpus", "tokenizer", "tokenized_corpus", "cooccurrence", "ppmi", "lm")


class Lines:
    """Shuffled WikiText-2 lines, numbered so that no two lines of the whole run are the same."""

    def __init__(self, seed: int = 0) -> None:
        self.lines = [line.strip() for line in WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()
                      if line.strip()]
        self.rng, self.number = random.Random(seed), 0

    def write(self, path: Path, size: int, mode: str = "w") -> None:
        written = 0
        with path.open(mode, encoding="utf-8") as f:
            while written < size:
                line = f"{self.number}. {self.rng.choice(self.lines)}\n"
                f.write(line)
                written += len(line.encode())
                self.number += 1


def build(store: ArtifactStore, folder: Path, parallel: ParallelParams, dim: int,
          warm: bool = True) -> tuple[dict, dict[str, float]]:
    """Every stage's artifact and its seconds."""
    times: dict[str, float] = {}

    def timed(name: str, stage, **arguments):
        start = time.perf_counter()
        ref = publish(store, stage, **arguments)
        times[name] = time.perf_counter() - start
        return ref

    corpus = CorpusParams(sources=sorted(str(p) for p in folder.iterdir()))
    docs = timed("corpus", ingest_corpus, params=corpus, parallel=parallel)
    words = timed("tokenizer", learn_vocabulary, corpus=docs, params=VocabularyParams(), parallel=parallel)
    tokens = timed("tokenized_corpus", encode_corpus, corpus=docs, tokenizer=words, parallel=parallel)
    counts = timed("cooccurrence", count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams(),
                   parallel=parallel)
    pmi = timed("ppmi", compute_ppmi, cooccurrence=counts, params=PPMIParams())
    vectors = timed("svd", svd_embeddings, ppmi=pmi, params=SVDParams(dim=dim, warm_start=warm))
    lm = timed("lm", train_lm, tokens=tokens, tokenizer=words, model="ngram", params=NgramParams())
    evaluated = timed("evaluation", evaluate_embeddings, embeddings=vectors, params=EvaluationParams())
    refs = {"corpus": docs, "tokenizer": words, "tokenized_corpus": tokens, "cooccurrence": counts, "ppmi": pmi,
            "embeddings.svd": vectors, "evaluation.svd": evaluated, "lm.ngram": lm}
    checked = timed("checks", check_artifacts, candidates=refs, released=None, params=ChecksParams())
    timed("report", write_report, evaluations=[evaluated], lms=[lm], checks=checked)
    return {**refs, "svd": vectors, "lm": lm}, times


def differing(a: dict, b: dict) -> list[str]:
    """The count-based kinds whose version or files differ between two builds."""
    found = []
    for kind in COUNT_BASED:
        left, right = a[kind], b[kind]
        files = [ArtifactStore(ref.store).manifest(ref.kind, ref.version)["files"] for ref in (left, right)]
        if left.version != right.version or files[0] != files[1]:
            found.append(kind)
    return found


def run(quick: bool = False, files: str = "10", file_mb: str = "3.0", runner: str = "threads", workers: str = "2",
        dim: str = "300", svd_warm: str = "1") -> list[Row]:
    n_files, size = (4, 50_000) if quick else (int(files), int(float(file_mb) * 1e6))
    dim_n = 20 if quick else int(dim)
    parallel = ParallelParams(runner=runner, workers=int(workers), pieces=True)
    warm = svd_warm not in ("0", "false", "no")
    lines = Lines()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="lexiflow-incremental-") as scratch:
        folder = Path(scratch) / "sources"
        folder.mkdir()
        for i in range(n_files):
            lines.write(folder / f"part-{i:03d}.txt", size)
        total = n_files * size
        store = ArtifactStore(Path(scratch) / "store")
        _refs, cold = build(store, folder, parallel, dim_n, warm)
        case_name = f"{n_files} files x {size / 1e6:g} MB, {runner}"
        for stage, seconds in cold.items():
            rows.append(Row("incremental", f"{case_name}: cold, {stage}", "seconds", seconds, higher_is_better=False))

        def append(fraction: float) -> None:
            lines.write(folder / f"part-{len(list(folder.iterdir())):03d}-new.txt", int(total * fraction))

        def remove() -> None:
            sorted(folder.iterdir())[n_files // 2].unlink()

        def edit() -> None:
            lines.write(sorted(folder.iterdir())[1], 2000, mode="a")

        changes = [("1% append", lambda: append(0.01)), ("10% append", lambda: append(0.10)),
                   ("one file removed", remove), ("one file edited", edit)]
        for k, (name, change) in enumerate(changes):
            change()
            rebuilt, times = build(store, folder, parallel, dim_n, warm)  # SVD warm-started from the last build
            fresh, full = build(ArtifactStore(Path(scratch) / f"fresh-{k}"), folder, parallel, dim_n, warm)  # cold
            for stage in times:
                rows.append(Row("incremental", f"{case_name}: {name}, {stage}", "seconds", times[stage], full[stage],
                                "full build of the same corpus", higher_is_better=False,
                                notes=f"cold (first corpus): {cold[stage]:.2f} s"))
            counted = [stage for stage in times if stage in COUNT_BASED]
            ours, peer = sum(times[s] for s in counted), sum(full[s] for s in counted)
            rows.append(Row("incremental", f"{case_name}: {name}, corpus to PPMI and n-gram", "seconds", ours, peer,
                            "full build of the same corpus", False, "ratio <= 0.1", ours <= 0.1 * peer))
            ours_all, peer_all = sum(times.values()), sum(full.values())
            rows.append(Row("incremental", f"{case_name}: {name}, every stage", "seconds", ours_all, peer_all,
                            "full build of the same corpus", False, "ratio <= 0.35", ours_all <= 0.35 * peer_all,
                            notes=f"SVD {'warm-started' if warm else 'cold'}; evaluation, checks and report "
                                  "included; without Prefect's own overhead"))
            diff = differing(rebuilt, fresh)
            rows.append(Row("incremental", f"{case_name}: {name}, count-based artifacts", "identical", float(not diff),
                            target="== 1", met=not diff,
                            notes="identical: " + ", ".join(f"{kind} {'differs' if kind in diff else 'identical'}"
                                                            for kind in COUNT_BASED)))
            (Path(scratch) / f"fresh-{k}").rename(Path(scratch) / f"done-{k}")  # kept until the end: the comparison
    return rows
