"""Co-occurrence counting throughput: ours vs a straightforward NumPy sort-and-count reference,
one core, window 5, harmonic weights, on a ≥ 10 M-token stream of real sentences: the counting kernel
(`cooccurrence_matrix`) and the `cooccurrence` stage as the pipeline runs it (a tokenized-corpus
artifact in a local store: Parquet read, <unk> removal, subsampling, per-distance counts, the
term-document matrix, weighting and symmetrising, the Parquet artifact written and published), one
shard per 500 k sentences (the default, `COOCCURRENCE_SHARD_SENTENCES`), on the local runner. Speeds are
tokens over CPU seconds of this process (per core; the machine is shared, so CPU time rather than
wall time), best of 3."""

from __future__ import annotations

import tempfile
import time

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from lexiflow.models.cooccurrence import cooccurrence_matrix
from lexiflow.tasks.params import CooccurrenceParams
from threadpoolctl import threadpool_limits

from benchmarks.corpora import repeated_stream
from benchmarks.harness import Row


def reference(ids: np.ndarray, offsets: np.ndarray, vocab_size: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The textbook vectorized version: all pairs as int64 keys, np.unique, bincount of weights."""
    sentence = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    keys, weights = [], []
    for d in range(1, window + 1):
        same = sentence[:-d] == sentence[d:]
        a, b = ids[:-d][same].astype(np.int64), ids[d:][same].astype(np.int64)
        keys += [a * vocab_size + b, b * vocab_size + a]
        weights += [np.full(2 * len(a), 1.0 / d)]
    unique, inverse = np.unique(np.concatenate(keys), return_inverse=True)
    return unique, np.bincount(inverse, weights=np.concatenate(weights))


def _cpu(fn, repeats: int = 3):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.process_time()
        out = fn()
        best = min(best, time.process_time() - start)
    return out, best


def stage_seconds(ids: np.ndarray, offsets: np.ndarray, vocab_size: int, repeats: int = 3) -> float:
    """CPU seconds of the `cooccurrence` stage's builder on these sentences (a 20-sentence document each,
    all train), best of `repeats`."""
    from lexiflow.models.vocab import SPECIALS
    from lexiflow.storage import ArtifactStore
    from lexiflow.storage.formats import TOKENS, VOCAB
    from lexiflow.tasks.matrices import count_cooccurrence
    from lexiflow.tasks.params import ParallelParams

    n_sent = len(offsets) - 1
    lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids.astype(np.uint32)))
    table = pa.table({"doc_index": pa.array((np.arange(n_sent) // 20).astype(np.uint32)),
                      "sentence": pa.array(np.arange(n_sent, dtype=np.uint32)), "split": ["train"] * n_sent,
                      "ids": lists}, schema=TOKENS)
    counts = np.bincount(ids, minlength=vocab_size).astype(np.uint64)
    counts[: len(SPECIALS)] = 0
    best = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        store = ArtifactStore(tmp)
        with store.writer("tokenized_corpus", "0" * 16) as out:
            pq.write_table(table, out.path("tokens.parquet"), row_group_size=50_000)
        with store.writer("tokenizer", "1" * 16) as out:
            out.write_parquet("vocab.parquet", pl.DataFrame({"id": np.arange(vocab_size, dtype=np.uint32),
                                                              "token": [f"w{i}" for i in range(vocab_size)],
                                                              "count": counts}), VOCAB)
        args = {"tokens": store.ref("tokenized_corpus", "0" * 16), "tokenizer": store.ref("tokenizer", "1" * 16),
                "params": CooccurrenceParams(), "parallel": ParallelParams(runner="local")}
        for attempt in range(repeats):
            inputs, params, version = count_cooccurrence.describe({"store": store.url, **args})
            version = f"{attempt:x}" + version[1:]  # a fresh version each time: the stage never reuses one
            start = time.process_time()
            with store.writer("cooccurrence", version, inputs=inputs, parameters=params) as out:
                count_cooccurrence.fn.__wrapped__(out, **args)
            best = min(best, time.process_time() - start)
    return best


def run(quick: bool = False) -> list[Row]:
    n = 300_000 if quick else 10_000_000
    ids, offsets, vocab_size = repeated_stream(n)
    with threadpool_limits(1):
        ours, t_ours = _cpu(lambda: cooccurrence_matrix(ids, offsets, vocab_size, window=5, weighting="harmonic"))
        (keys, values), t_ref = _cpu(lambda: reference(ids, offsets, vocab_size, 5), repeats=1)
        t_stage = stage_seconds(ids, offsets, vocab_size, repeats=1 if quick else 3)
    coo = ours.tocoo()
    ours_keys = coo.row.astype(np.int64) * vocab_size + coo.col
    order = np.argsort(ours_keys)
    assert np.array_equal(ours_keys[order], keys) and np.allclose(coo.data[order], values), "results differ"
    tokens = len(ids)
    rate, ref_rate = tokens / t_ours, tokens / t_ref
    case = f"window 5 harmonic, {tokens / 1e6:.1f}M tokens, V={vocab_size}, 1 core"
    stage_rate = tokens / t_stage
    defaults = CooccurrenceParams()
    return [
        Row("cooccurrence", case, "kernel tokens/s (CPU time)", rate, ref_rate, "numpy sort-and-count", True,
            ">= 1e7", rate >= 1e7, "identical matrices checked; best of 3"),
        Row("cooccurrence", case, "kernel seconds (CPU time)", t_ours, t_ref, "numpy sort-and-count", False),
        Row("cooccurrence", case.replace("window 5 harmonic", "cooccurrence stage (defaults: window "
                                         f"{defaults.window} {defaults.weighting}, subsample {defaults.subsample:g})"),
            "stage tokens/s (CPU time)", stage_rate, ref_rate, "numpy sort-and-count (kernel only)", True, ">= 5e6",
            stage_rate >= 5e6, f"stage {t_stage:.2f} s vs kernel alone {t_ours:.2f} s, best of 3; profile in "
                               "benchmarks/results/scaling-notes.md"),
    ]
