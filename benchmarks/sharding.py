"""Sharded counting on Dask: word counting (vocabulary) and co-occurrence counting, in tokens/s,
on a Dask LocalCluster with 1 and with 2 worker processes (one thread each) against the
single-process path, in the same run, on the same tokenized corpus (WikiText-2 lines).

The clusters are started and warmed up before timing, as a running cluster would be; each timed run is the
whole stage as the pipeline runs it (plan, shard tasks on the cluster, parts, merge, publish), its output
deleted first so it is recomputed. Every run's artifact is checked equal to the single-process one.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from distributed import Client, LocalCluster
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, ParallelParams, VocabularyParams
from lexiflow.tasks.runners import new_worker_cluster
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary
from prefect import flow
from prefect.testing.utilities import prefect_test_harness

from benchmarks.corpora import plain_text_file
from benchmarks.harness import Row


@flow(name="benchmark-stage")
def _timed_stage(stage: Any, store: str, arguments: dict[str, Any]) -> tuple[float, ArtifactRef]:
    """A stage run as the pipeline runs it (a task in a flow run), timed inside the flow run: the run's own
    exit waits up to 1 s for Prefect's heartbeat thread (it sleeps in 1 s steps), a cost per flow run, not
    per stage (benchmarks/results/scaling-notes.md)."""
    start = time.perf_counter()
    ref = stage(store, **arguments)
    return time.perf_counter() - start, ref


def _run_stage(stage: Any, store: str, arguments: dict[str, Any]) -> ArtifactRef:
    return _timed_stage(stage, store, arguments)[1]


def time_stage(stage: Any, store: str, arguments: dict[str, Any],
               parallel: ParallelParams) -> tuple[float, ArtifactRef]:
    """Seconds to build one stage's artifact from scratch with this runner (inside a flow run)."""
    artifacts = ArtifactStore(store)
    version = stage.version_of({"store": store, **arguments})
    if artifacts.exists(stage.name, version):
        artifacts.delete(stage.name, version)
    return _timed_stage(stage, store, {**arguments, "parallel": parallel})


def dask_params(cluster: LocalCluster, **shards: int) -> ParallelParams:
    return ParallelParams(runner="dask", dask_address=cluster.scheduler_address, **shards)


def _warm_up() -> None:
    import lexiflow.tasks.matrices  # noqa: F401 - what the shard tasks import, loaded once per worker
    import lexiflow.tasks.vocabulary  # noqa: F401


def cluster(workers: int) -> LocalCluster:
    """A running cluster, as in production: worker processes started and warm (modules imported) before
    anything is timed."""
    started = new_worker_cluster(workers)
    with Client(started.scheduler_address, set_as_default=False) as client:
        client.run(_warm_up)
    return started


def _same(a: ArtifactRef, b: ArtifactRef, name: str) -> bool:
    return ArtifactStore(a.store).read_parquet(a.kind, a.version, name).equals(
        ArtifactStore(b.store).read_parquet(b.kind, b.version, name))


def run(quick: bool = False) -> list[Row]:
    size = 4_000_000 if quick else 40_000_000
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, prefect_test_harness(server_startup_timeout=120):
        source = plain_text_file(Path(tmp) / "corpus.txt", size)
        store = str(Path(tmp) / "store")
        local = ParallelParams(runner="local")
        docs = _run_stage(ingest_corpus, store, {"params": CorpusParams(sources=[str(source)]), "parallel": local})
        words = _run_stage(learn_vocabulary, store, {"corpus": docs, "params": VocabularyParams(), "parallel": local})
        tokens = _run_stage(encode_corpus, store, {"corpus": docs, "tokenizer": words, "parallel": local})
        n_docs = ArtifactStore(store).manifest("corpus", docs.version)["metrics"]["documents"]
        n_sentences = ArtifactStore(store).manifest("tokenized_corpus", tokens.version)["metrics"]["sentences"]
        stages = {
            "word counting (vocabulary, train split)": (
                learn_vocabulary, {"corpus": docs, "params": VocabularyParams()}, "vocab.parquet", "train_tokens",
                -(-n_docs // 8)),
            "co-occurrence counting (window 5 harmonic + term-document)": (
                count_cooccurrence, {"tokens": tokens, "tokenizer": words, "params": CooccurrenceParams()},
                "matrix.parquet", "tokens", -(-n_sentences // 8)),
        }
        for case, (stage, arguments, table, count, shard_rows) in stages.items():
            t_single, single = time_stage(stage, store, arguments, local)
            n_tokens = ArtifactStore(store).manifest(stage.name, single.version)["metrics"][count]
            for workers in (1, 2):
                with cluster(workers) as dask:
                    t_dask, ref = time_stage(stage, store, arguments, dask_params(dask, shard_rows=shard_rows))
                assert ref.version == single.version and _same(ref, single, table), "sharded result differs"
                rows.append(Row("sharding", f"{case}, {n_tokens / 1e6:.1f}M tokens, 8 shards on {workers} Dask "
                                f"worker{'s' if workers > 1 else ''}", "tokens/s", n_tokens / t_dask,
                                n_tokens / t_single, "single process", True, "", None,
                                f"dask {t_dask:.2f} s vs single {t_single:.2f} s; identical artifact"))
    return rows
