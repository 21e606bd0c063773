"""Incremental rebuilds (docs/design.md, "Incremental rebuilds"): a store that built a corpus before rebuilds a
changed one (a file appended, removed or edited) from the pieces it has seen and the new ones, and publishes
every count-based artifact with the version and the bytes of a from-scratch build of the new corpus."""

import itertools
import re
import shutil
import time

import polars as pl
import pytest
from lexiflow.storage import ArtifactStore
from lexiflow.storage.pieces import PIECES, garbage, read_uses, record_uses, remove_garbage
from lexiflow.tasks import ngram_pieces
from lexiflow.tasks import pieces as pieces_module
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.lm import train_lm
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.parallel import shard_ranges
from lexiflow.tasks.params import (
    CooccurrenceParams,
    CorpusParams,
    NgramParams,
    ParallelParams,
    PPMIParams,
    VocabularyParams,
)
from lexiflow.tasks.pieces import ENCODED, WORD_COUNTS, CorpusPieces, RunPieces
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from tests.stages import publish

WORDS = ("cat dog bird fish cow horse sheep goat mouse owl fox bear wolf deer hare lynx seal crab frog toad "
         "ant bee wasp moth").split()


def write_file(path, seed: int, lines: int = 60) -> None:
    """Lines of words, some repeated across files (duplicates the corpus drops), a blank line or two."""
    rows = []
    for i in range(lines):
        k = (seed * 7919 + i * 104729) % 1000
        rows.append("" if k % 17 == 0 else
                    "the shared line about animals ." if k % 13 == 0 else
                    " ".join(WORDS[(k + j * (seed + 3)) % len(WORDS)] for j in range(3 + k % 9)) + " .")
    path.write_text("\n".join(rows) + "\n")


def build(store: ArtifactStore, folder, parallel: ParallelParams) -> dict:
    sources = sorted(str(p) for p in folder.iterdir())
    corpus = CorpusParams(sources=sources, valid_fraction=0.2, test_fraction=0.2)
    docs = publish(store, ingest_corpus, params=corpus, parallel=parallel)
    words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=2), parallel=parallel)
    tokens = publish(store, encode_corpus, corpus=docs, tokenizer=words, parallel=parallel)
    counts = publish(store, count_cooccurrence, tokens=tokens, tokenizer=words, params=CooccurrenceParams(window=3),
                     parallel=parallel)
    pmi = publish(store, compute_ppmi, cooccurrence=counts, params=PPMIParams())
    lm = publish(store, train_lm, tokens=tokens, tokenizer=words, model="ngram", params=NgramParams())
    return {ref.kind: ref for ref in (docs, words, tokens, counts, pmi, lm)}


def assert_identical(a: dict, b: dict) -> None:
    """The same versions, and byte for byte the same files (sizes and SHA-256 in the manifests)."""
    assert {k: r.version for k, r in a.items()} == {k: r.version for k, r in b.items()}
    for kind, ref in a.items():
        left = ArtifactStore(ref.store).manifest(kind, ref.version)["files"]
        right = ArtifactStore(b[kind].store).manifest(kind, b[kind].version)["files"]
        assert left == right, kind


class Counting:
    """How many pieces of each stage were read from the store and how many were made (in this process)."""

    def __init__(self, monkeypatch) -> None:
        self.reused = {"corpus": 0, "word_counts": 0, "encoded": 0, "ngrams": 0}
        self.made = {"corpus": 0, "word_counts": 0, "encoded": 0, "ngrams": 0}
        for cls in (CorpusPieces, RunPieces):
            get, put = cls.get, cls.put

            def counted_get(obj, *args, get=get):
                found = get(obj, *args)
                self.reused[getattr(obj, "stage", "corpus")] += found is not None
                return found

            def counted_put(obj, *args, put=put):
                self.made[getattr(obj, "stage", "corpus")] += 1
                return put(obj, *args)

            monkeypatch.setattr(cls, "get", counted_get)
            monkeypatch.setattr(cls, "put", counted_put)


CHANGES = ["append", "remove", "edit"]


def change(folder, how: str) -> None:
    if how == "append":
        write_file(folder / "f9.txt", 99, lines=30)
    elif how == "remove":
        (folder / "f2.txt").unlink()
    else:
        with (folder / "f3.txt").open("a") as f:
            f.write("an edited line about a new animal : the okapi .\n")


@pytest.fixture()
def corpus_folder(tmp_path):
    folder = tmp_path / "sources"
    folder.mkdir()
    for i in range(6):
        write_file(folder / f"f{i}.txt", i)
    return folder


# Small shards: the 6 files make several shards, and the documents several word-count runs per shard.
SHARDS = {"shard_bytes": 2500, "shard_rows": 90, "pieces": True}  # pieces are off by default


@pytest.mark.parametrize("how", CHANGES)
def test_a_rebuild_after_a_change_publishes_what_a_full_build_does(tmp_path, corpus_folder, monkeypatch, how,
                                                                   caplog):
    monkeypatch.setattr(pieces_module, "PIECE_DOCUMENTS", 8)  # runs of ~8 documents: several per shard
    monkeypatch.setattr(ngram_pieces, "MERGE_RUNS", 3)  # the runs' n-gram counts summed in several batches
    if how == "edit":  # the n-grams grouped on their columns, as those of a vocabulary too large to pack are
        monkeypatch.setattr(ngram_pieces, "PACKED_BITS", 0)
    parallel = ParallelParams(runner="local", **SHARDS)
    store = ArtifactStore(tmp_path / "store")
    before = build(store, corpus_folder, parallel)
    change(corpus_folder, how)
    counting = Counting(monkeypatch)
    caplog.clear()
    rebuilt = build(store, corpus_folder, parallel)
    assert rebuilt["corpus"].version != before["corpus"].version
    if how == "append":  # a new vocabulary: the encoded runs seen before are remapped to it
        vocabularies = [ArtifactStore(ref.store).read_parquet("tokenizer", ref.version, "vocab.parquet")
                        for ref in (before["tokenizer"], rebuilt["tokenizer"])]
        assert not vocabularies[0].equals(vocabularies[1])
    # Only the changed file was read again; most word-count runs were found.
    changed = {"append": 1, "remove": 0, "edit": 1}[how]
    assert counting.made["corpus"] == changed
    assert counting.reused["corpus"] == len(list(corpus_folder.iterdir())) - changed
    for stage in ("word_counts", "encoded", "ngrams"):  # n-gram counts of the runs seen before, remapped
        assert counting.reused[stage] > counting.made[stage] > 0 or how == "remove", stage
    # and the run's log says so, stage by stage (what an operator checks after a scheduled rebuild)
    for kind, folder in (("corpus", "corpus"), ("tokenizer", "word_counts"), ("tokenized_corpus", "encoded"),
                         ("lm", "ngrams")):
        total, made = len(read_uses(store, kind, rebuilt[kind].version)[folder]), counting.made[folder]
        assert re.search(rf"{kind}: {total - made} of {total} .* taken from the store's pieces, {made} computed",
                         caplog.text), kind
    fresh = build(ArtifactStore(tmp_path / "fresh"), corpus_folder, parallel)
    assert_identical(rebuilt, fresh)
    # And with no pieces at all: the path that keeps none gives the same artifacts.
    plain = build(ArtifactStore(tmp_path / "plain"), corpus_folder, ParallelParams(runner="local",
                                                                                   **{**SHARDS, "pieces": False}))
    assert_identical(rebuilt, plain)
    assert not (tmp_path / "plain" / PIECES).exists()


def test_one_shard_and_a_large_file_in_byte_ranges_rebuild_the_same(tmp_path, corpus_folder):
    # One shard of every file (the single-shard path), and a file larger than a shard (its byte ranges). The
    # shard size is not versioned: a store keeps the row groups of the shards it first built with.
    big = corpus_folder / "f8.txt"
    for parallel in (ParallelParams(runner="local", pieces=True),
                     ParallelParams(runner="local", shard_bytes=3000, pieces=True)):
        store = ArtifactStore(tmp_path / f"store{parallel.shard_bytes}")
        write_file(big, 8, lines=400)
        build(store, corpus_folder, parallel)
        with big.open("a") as f:  # a growing log: its byte ranges move
            f.write("one more line about the growing log .\n")
        write_file(corpus_folder / "f9.txt", 9)
        assert_identical(build(store, corpus_folder, parallel),
                         build(ArtifactStore(tmp_path / f"fresh{parallel.shard_bytes}"), corpus_folder, parallel))
        (corpus_folder / "f9.txt").unlink()


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_rebuilds_on_a_pool_publish_what_a_full_build_does(tmp_path, corpus_folder, runner):
    parallel = ParallelParams(runner=runner, workers=2, **SHARDS)
    store = ArtifactStore(tmp_path / "store")
    build(store, corpus_folder, parallel)
    for how in CHANGES:
        change(corpus_folder, how)
        assert_identical(build(store, corpus_folder, parallel),
                         build(ArtifactStore(tmp_path / f"fresh-{how}"), corpus_folder, parallel))


def test_rebuilds_on_dask_publish_what_a_full_build_does(tmp_path, corpus_folder):
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        parallel = ParallelParams(runner="dask", dask_address=cluster.scheduler_address, **SHARDS)
        store = ArtifactStore(tmp_path / "store")
        build(store, corpus_folder, parallel)
        change(corpus_folder, "append")
        rebuilt = build(store, corpus_folder, parallel)
    assert_identical(rebuilt, build(ArtifactStore(tmp_path / "fresh"), corpus_folder,
                                    ParallelParams(runner="local", **SHARDS)))


def test_gc_removes_the_pieces_no_artifact_uses(tmp_path, corpus_folder):
    parallel = ParallelParams(runner="local", **SHARDS)
    store = ArtifactStore(tmp_path / "store")
    before = build(store, corpus_folder, parallel)
    pieces = tmp_path / "store" / PIECES
    assert garbage(store, older_than=0) == []  # every piece is some artifact's
    (corpus_folder / "f1.txt").unlink()
    after = build(store, corpus_folder, parallel)
    assert garbage(store, older_than=0) == []  # the old corpus still uses f1's piece
    # The records of artifacts about to be removed go at once (`gone`), young pieces stay (a build at work)
    gone = [(kind, before[kind].version) for kind in ("corpus", "tokenizer")]
    assert garbage(store, older_than=3600, gone=gone) == [
        str(pieces / "uses" / kind / f"{version}.json") for kind, version in gone]
    for kind, version in gone:
        store.delete(kind, version)
    assert garbage(store, older_than=3600) == []  # a record without its artifact: a build at work, while young
    found = garbage(store, older_than=0)
    remove_garbage(store, found)
    assert garbage(store, older_than=0) == []
    corpus_keys = {p.name for p in (pieces / "corpus").iterdir()}
    assert len(corpus_keys) == 5  # f1's piece went with the corpus that used it
    # What is left still rebuilds the corpus from its pieces alone, the same artifacts
    fresh = build(ArtifactStore(tmp_path / "fresh"), corpus_folder, parallel)
    shutil.rmtree(tmp_path / "store" / "corpus")
    assert_identical(build(store, corpus_folder, parallel), fresh)
    assert after["corpus"].version == fresh["corpus"].version
    # A data file no piece.json names (a writer that lost the race) goes too, once old
    stray = next((pieces / "corpus").iterdir()) / "documents-000000000000"
    stray.write_bytes(b"x")
    assert str(stray) not in garbage(store, older_than=3600)
    old = time.time() - 7200
    import os
    os.utime(stray, (old, old))
    for path in (pieces / "corpus").rglob("*"):
        os.utime(path, (old, old))
    assert garbage(store, older_than=3600) == [str(stray)]


def test_the_word_count_runs_are_cut_by_content(monkeypatch):
    monkeypatch.setattr(pieces_module, "PIECE_DOCUMENTS", 4)
    ids = pl.Series([f"{i * 2654435761 % 2**32:08x}00000000" for i in range(40)])
    runs = pieces_module.content_cuts(ids, 0, 40)
    assert runs[0][0] == 0 and runs[-1][1] == 40 and all(a < b for a, b in runs)
    # A document inserted leaves every run before and after its own the same content
    inserted = pl.concat([ids.slice(0, 20), pl.Series(["ffffffff00000001"]), ids.slice(20)])
    again = pieces_module.content_cuts(inserted, 0, 41)
    contents = {tuple(ids.slice(a, b - a)) for a, b in runs}
    assert sum(tuple(inserted.slice(a, b - a)) not in contents for a, b in again) == 1


def test_shards_cut_between_runs_so_a_rebuild_recounts_only_new_runs(tmp_path, corpus_folder, monkeypatch):
    """No shard boundary splits a run: the runs the tokenizer and the tokenized corpus are made of are the whole
    corpus's content-defined runs, whatever the shards; so after an append, which moves every shard boundary,
    the runs counted again are those that hold the new file's documents."""
    monkeypatch.setattr(pieces_module, "PIECE_DOCUMENTS", 8)
    parallel = ParallelParams(runner="local", **SHARDS)
    store = ArtifactStore(tmp_path / "store")
    build(store, corpus_folder, parallel)
    change(corpus_folder, "append")
    counting = Counting(monkeypatch)
    rebuilt = build(store, corpus_folder, parallel)
    corpus = rebuilt["corpus"]
    assert len(shard_ranges(corpus, "documents.parquet", parallel)) >= 3
    documents = store.read_parquet("corpus", corpus.version, "documents.parquet")
    runs = [documents.slice(a, b - a) for a, b in pieces_module.content_cuts(documents["doc_id"], 0,
                                                                             documents.height)]
    for kind, stage in (("tokenizer", WORD_COUNTS), ("tokenized_corpus", ENCODED)):  # no run split in two
        assert len(read_uses(store, kind, rebuilt[kind].version)[stage]) == len(runs)
    new_file = documents.with_row_index().filter(pl.col("source").str.ends_with("f9.txt"))["index"]
    holding_new = sum(any(a <= i < a + rows.height for i in new_file.to_list())
                      for a, rows in zip(itertools.accumulate([0, *[r.height for r in runs[:-1]]]), runs,
                                         strict=True))
    assert 0 < holding_new < len(runs) // 2
    for stage in (WORD_COUNTS, ENCODED):
        assert counting.made[stage] == holding_new, stage

def test_a_uses_record_keeps_a_piece_as_often_as_the_artifact_holds_it(tmp_path):
    # Two runs of the same documents are one piece, counted twice by a stage that adds runs (the n-gram LM)
    store = ArtifactStore(tmp_path / "store")
    assert read_uses(store, "tokenized_corpus", "v1") is None  # built without pieces
    record_uses(store, "tokenized_corpus", "v1", {"encoded": ["b", "a", "b"]})
    assert read_uses(store, "tokenized_corpus", "v1") == {"encoded": ["a", "b", "b"]}
