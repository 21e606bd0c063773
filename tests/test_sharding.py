"""Sharded stages give exactly the single-process results: ingestion by byte ranges (boundaries in
the middle of lines), vocabulary counts, encoding and co-occurrence by row ranges. One file over 600 lines: each
stage's cases build on the same generated corpora and the same sharded-versus-whole comparison."""

import bz2
import concurrent.futures
import dataclasses
import gzip
import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from lexiflow.models.cooccurrence import (
    cooccurrence_matrix,
    distance_counts,
    id_stream,
    keep_probabilities,
    subsample,
    weigh,
)
from lexiflow.models.errors import InputError
from lexiflow.models.ingest import (
    FileRange,
    IngestOptions,
    ShardResult,
    build_corpus,
    first_in_table,
    ingest_shard,
    merge_shards,
    plan_shards,
)
from lexiflow.models.shards import aligned, equal_ranges, shard_count
from lexiflow.models.vocab import SPECIALS
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import DOCUMENTS, SHARDED_ROW_GROUP, by_columns, read_matrix, write_matrix_columns
from lexiflow.storage.writer import ArtifactWriter, write_segment
from lexiflow.tasks.corpus import documents_writer, ingest_corpus
from lexiflow.tasks.matrices import count_cooccurrence
from lexiflow.tasks.parallel import shard_ranges
from lexiflow.tasks.params import CooccurrenceParams, CorpusParams, ParallelParams, VocabularyParams
from lexiflow.tasks.parts import join_rows, row_partitions, sum_matrices
from lexiflow.tasks.shards import termdoc_pieces
from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

from tests.stages import publish
from tests.test_cooccurrence import term_document_reference


def sharded(files, options, shard_bytes):
    shards = plan_shards(files, options, shard_bytes)
    return merge_shards(files, [ingest_shard(shard, options) for shard in shards], options), shards


LINES = ["The cat sat. Dr. Smith came home!", "", "  a   second   line  ", "The cat sat. Dr. Smith came home!",
         "é café\u2028split by a line separator", "crlf line\r", "Ünïcödé ÅÄÖ text. Another sentence here.",
         "x" * 40, "last line without newline"]


@pytest.fixture()
def files(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(b"\xef\xbb\xbf" + "\n".join(LINES).encode())  # UTF-8 BOM, CRLF, U+2028, no final newline
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" + ("\n" if i == 2 else "")
                             for i, t in enumerate(LINES[:6])))
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(b"gzipped one\nThe cat sat. Dr. Smith came home!\n"))
    bad = tmp_path / "d.txt"
    bad.write_bytes(b"fine line\n" * 6 + b"bad \xff byte\n" + b"more\n")  # invalid UTF-8 on line 7
    empty = tmp_path / "e.txt"
    empty.write_bytes(b"")
    wiki = tmp_path / "f.xml.bz2"
    wiki.write_bytes(bz2.compress(b"<mediawiki><page><title>T</title><ns>0</ns><revision><text>Wiki text "
                                  b"here.</text></revision></page></mediawiki>"))
    return [text, jsonl, packed, bad, empty, wiki]


@pytest.mark.parametrize("shard_bytes", [1, 3, 7, 16, 29, 64, 1 << 30])
def test_sharded_ingestion_equals_single_process(files, shard_bytes):
    options = IngestOptions(bad_files="skip", valid_fraction=0.3, test_fraction=0.3)
    whole = build_corpus(files, options)
    corpus, shards = sharded(files, options, shard_bytes)
    assert corpus.documents.equals(whole.documents)
    assert corpus.stats == whole.stats
    assert whole.stats["skipped_inputs"] == 2
    assert "d.txt:7: invalid UTF-8 (byte 64)" in whole.stats["skipped"][0]["reason"]
    if shard_bytes < 64:  # the text files were cut in byte ranges, mid-line; compressed/XML files stay whole
        assert sum(1 for s in shards for part in s if part.path.endswith("a.txt")) > 3
        assert all(part.stop is None for s in shards for part in s if part.path.endswith((".gz", ".bz2")))


def test_a_streamed_merge_equals_the_whole_and_reads_each_shard_only_when_it_writes_it(tmp_path, files):
    """`merge_shards(write=...)` over parts (LazyFrames, as the corpus stage gets them from its
    shards): the written documents and the stats are those of one process, and a shard's texts are
    read only when its turn comes (memory: one shard at a time)."""
    later = tmp_path / "g.txt"  # repeats a document of the skipped bad file d.txt: kept here
    later.write_text("fine line\nsomething new\n")
    files = [*files, later]
    options = IngestOptions(bad_files="skip", valid_fraction=0.3, test_fraction=0.3)
    whole = build_corpus(files, options)
    assert "fine line" in whole.documents["text"].to_list()
    shards = plan_shards(files, options, 16)
    paths = [tmp_path / f"part-{i}.parquet" for i in range(len(shards))]

    def parts() -> list[ShardResult]:
        results = []
        for shard, path in zip(shards, paths, strict=True):
            result = ingest_shard(shard, options)
            result.documents.write_parquet(path)
            results.append(ShardResult(pl.scan_parquet(path), result.texts, result.errors, result.words))
        return results

    written: list[pl.DataFrame] = []
    corpus = merge_shards(files, parts(), options, lambda docs, _encoded, _texts: written.append(docs))
    assert len(written) == len(shards) and corpus.documents is None
    assert pl.concat(written).equals(whole.documents) and corpus.stats == whole.stats

    def write_then_change_the_next_part(docs: pl.DataFrame, _encoded: object, _texts: object) -> None:
        written.append(docs)
        if len(written) < len(paths):
            changed = pl.read_parquet(paths[len(written)]).with_columns(pl.col("text").str.to_uppercase())
            changed.write_parquet(paths[len(written)])

    written.clear()
    merge_shards(files, parts(), options, write_then_change_the_next_part)
    texts = [t for docs in written[1:] for t in docs["text"]]
    assert written[0].height and written[0]["text"].str.contains("[a-z]").all()
    assert texts and texts == [t.upper() for t in texts]


@pytest.mark.parametrize("bad_files", ["fail", "skip"])
def test_a_large_files_ranges_merge_as_they_come_unless_skipping_needs_the_whole_file(tmp_path, bad_files):
    """One file in byte ranges, results streamed: with bad_files="fail" each range is written before the next
    arrives (an error further on fails the whole ingestion anyway); "skip" may drop the file, so it waits
    for all of it. The same corpus either way."""
    path = tmp_path / "big.txt"
    path.write_text("".join(f"line number {i} of the big file.\n" for i in range(200)))
    options = IngestOptions(bad_files=bad_files)
    shards = plan_shards([path], options, 1500)
    assert len(shards) >= 4 and all(len(shard) == 1 and shard[0].file == 0 for shard in shards)
    events: list[str] = []

    def results():
        for i, shard in enumerate(shards):
            events.append(f"read {i}")
            yield ingest_shard(shard, options)

    written: list[pl.DataFrame] = []
    corpus = merge_shards([path], results(), options, lambda docs, *_: (events.append("write"), written.append(docs)))
    n = len(shards)
    expected = [e for i in range(n) for e in (f"read {i}", "write")] if bad_files == "fail" \
        else [f"read {i}" for i in range(n)] + ["write"] * n
    assert events == expected
    assert pl.concat(written).equals(build_corpus([path], options).documents)
    assert corpus.stats == build_corpus([path], options).stats


def test_the_merge_takes_a_shards_encoded_rows_only_when_it_keeps_exactly_them(tmp_path, files):
    """A shard encodes its first copies as documents.parquet row groups (`ShardResult.encoded`); the merge hands
    them on when it keeps those very rows, and None (the caller encodes what it keeps) after a duplicate of an
    earlier shard or with a bad file left out, whose rows the shard could not know to drop."""
    options = IngestOptions(bad_files="skip")
    later = tmp_path / "g.txt"  # a document of a.txt again, and one of the bad d.txt (kept here: d.txt is skipped)
    later.write_text("The cat sat. Dr. Smith came home!\nfine line\n")
    fresh = tmp_path / "h.txt"
    fresh.write_text("nothing seen before\nand again nothing\nand again nothing\n")  # a duplicate in itself
    sources = [files[0], files[3], later, fresh]
    results = []
    for i, path in enumerate(sources):  # a shard per file
        result = ingest_shard([FileRange(str(path), i)], options)
        first = first_in_table(result.documents["doc_id"])
        result.encoded = write_segment(result.documents.filter(first), DOCUMENTS, SHARDED_ROW_GROUP)
        results.append(result)
    handed: list[tuple] = []
    corpus = merge_shards(sources, results, options, lambda docs, encoded, _texts: handed.append((docs, encoded)))
    assert [encoded is results[i].encoded for i, (_, encoded) in enumerate(handed)] == [True, False, False, True]
    assert [docs.height for docs, _ in handed] == [results[0].encoded.rows, 0, 1, 2]  # d.txt out, "fine line" kept
    whole = build_corpus(sources, options)
    assert pl.concat([docs for docs, _ in handed]).equals(whole.documents) and corpus.stats == whole.stats
    encoded = pl.read_parquet(io.BytesIO(results[3].encoded.source))
    assert encoded.equals(handed[3][0])  # what the shard encoded is what the merge keeps

    # Delivered as a pool's shards deliver them, without their texts (they are in the encoded rows): the
    # documents file is the same, byte for byte, the texts of the tables it re-encodes found by id.
    assert written_without_texts(tmp_path, sources, results, options) == written_without_texts.whole
    assert pl.read_parquet(io.BytesIO(written_without_texts.whole)).equals(whole.documents)


def written_without_texts(tmp_path, sources, results: list[ShardResult], options: IngestOptions) -> bytes:
    """documents.parquet as the corpus stage writes it from these shard results delivered without their texts
    (its `whole` attribute: from the results as they are)."""
    def documents_file(name: str, results: list[ShardResult]) -> bytes:
        out = ArtifactWriter(tmp_path / name, tmp_path / f"{name}-scratch", tmp_path / f"{name}-work")
        out.folder.mkdir()
        with out.parquet_parts("documents.parquet", DOCUMENTS, SHARDED_ROW_GROUP) as write:
            merge_shards(sources, results, options, documents_writer(write))
        return out.path("documents.parquet").read_bytes()

    written_without_texts.whole = documents_file("whole", results)
    return documents_file("textless", [dataclasses.replace(r, documents=r.documents.drop("text")) for r in results])


def test_texts_found_by_id_without_dedupe(tmp_path):
    """Without dedupe a shard's encoded rows repeat a text: one text per id still (a bad file left out makes
    the merge re-encode the shard's other rows)."""
    bad, good = tmp_path / "bad.txt", tmp_path / "good.txt"
    bad.write_bytes(b"a line before the error\nbad \xff byte\n")
    good.write_text("same text\nsame text\nother text\n")
    options = IngestOptions(bad_files="skip", dedupe=False)
    result = ingest_shard([FileRange(str(bad), 0), FileRange(str(good), 1)], options)
    result.encoded = write_segment(result.documents, DOCUMENTS, SHARDED_ROW_GROUP)
    written = written_without_texts(tmp_path, [bad, good], [result], options)
    assert pl.read_parquet(io.BytesIO(written))["text"].to_list() == ["same text", "same text", "other text"]
    assert written == written_without_texts.whole


def test_an_error_in_a_later_range_fails_the_ingestion_after_earlier_ranges_merged(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"a fine line of text.\n" * 200 + b"bad \xff byte\n" + b"more text.\n" * 20)
    options = IngestOptions()  # bad_files="fail"
    with pytest.raises(InputError) as whole:
        build_corpus([path], options)
    written: list[pl.DataFrame] = []
    with pytest.raises(InputError) as streamed:
        merge_shards([path], (ingest_shard(shard, options) for shard in plan_shards([path], options, 1000)),
                     options, lambda docs, *_: written.append(docs))
    assert str(streamed.value) == str(whole.value) and "big.txt:201: invalid UTF-8" in str(whole.value)
    assert written  # the ranges before it were merged (the stage's writer then fails: nothing is published)


def test_a_range_owns_the_lines_that_start_inside_it(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("aa\nbbbb\ncc\n")  # lines start at bytes 0, 3, 8
    options = IngestOptions(split_sentences=False, lowercase=False)
    texts = [ingest_shard([FileRange(str(path), 0, a, a + 4)], options).documents["text"].to_list()
             for a in (0, 4, 8)]
    assert texts == [["aa", "bbbb"], [], ["cc"]]


def test_errors_in_a_later_range_name_the_files_line_and_byte(tmp_path):
    text = tmp_path / "big.txt"
    text.write_bytes(b"line\n" * 50 + b"bad \xc3\x28 here\n" + b"after\n" * 10)
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text('{"text": "ok"}\n' * 40 + "{not json\n" + '{"text": "ok"}\n' * 5)
    mixed = tmp_path / "mixed.jsonl"  # a JSON error early, invalid UTF-8 later: decoding errors come first
    mixed.write_bytes(b'{"text": "a"}\n' + b"{oops\n" + b'{"text": "b"}\n' * 30 + b'{"text": "\xff"}\n')
    options = IngestOptions()
    for path, expected in ((text, f"{text}:51: invalid UTF-8 (byte 254)"), (jsonl, f"{jsonl}:41: invalid JSON"),
                           (mixed, f"{mixed}:33: invalid UTF-8")):
        with pytest.raises(InputError) as whole:
            build_corpus([path], options)
        with pytest.raises(InputError) as parts:
            sharded([path], options, 16)
        assert str(parts.value) == str(whole.value) and str(whole.value).startswith(expected)


@settings(max_examples=40, deadline=None)
@given(lines=st.lists(st.text(alphabet="ab .A\n\r\u2028é", max_size=12), min_size=1, max_size=15),
       shard_bytes=st.integers(1, 40))
def test_any_cut_of_random_lines_gives_the_same_corpus(tmp_path_factory, lines, shard_bytes):
    path = tmp_path_factory.mktemp("h") / "r.txt"
    path.write_text("\n".join(lines), encoding="utf-8", newline="")
    options = IngestOptions(dedupe=True)
    try:
        whole = build_corpus([path], options)
    except InputError as exc:
        with pytest.raises(InputError, match="empty"):
            sharded([path], options, shard_bytes)
        assert "empty" in str(exc)
        return
    corpus, _ = sharded([path], options, shard_bytes)
    assert corpus.documents.equals(whole.documents) and corpus.stats == whole.stats


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 25), min_size=1, max_size=10), cut=st.integers(0, 10),
       window=st.integers(1, 6), weighting=st.sampled_from(["uniform", "harmonic"]))
def test_cooccurrence_counts_of_sentence_ranges_add_up_exactly(lengths, cut, window, weighting):
    rng = np.random.default_rng(len(lengths) * 31 + cut)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    ids = rng.integers(0, 7, offsets[-1])
    cut = min(cut, len(lengths))
    first = distance_counts(ids[: offsets[cut]], offsets[: cut + 1], 7, window)
    second = distance_counts(ids[offsets[cut]:], offsets[cut:] - offsets[cut], 7, window)
    merged = weigh(second + first, 7, weighting)  # any order
    whole = cooccurrence_matrix(ids, offsets, 7, window, weighting, chunk_tokens=5)
    assert np.array_equal(merged.toarray(), whole.toarray())  # bit for bit, harmonic weights included


def stage_outputs(store: ArtifactStore, sources: list[str], parallel: ParallelParams) -> dict:
    corpus = CorpusParams(sources=sources, valid_fraction=0.2, test_fraction=0.2)
    docs = publish(store, ingest_corpus, params=corpus, parallel=parallel)
    words = publish(store, learn_vocabulary, corpus=docs, params=VocabularyParams(min_count=1), parallel=parallel)
    tokens = publish(store, encode_corpus, corpus=docs, tokenizer=words, parallel=parallel)
    counts = publish(store, count_cooccurrence, tokens=tokens, tokenizer=words,
                     params=CooccurrenceParams(window=3), parallel=parallel)
    return {ref.kind: ref for ref in (docs, words, tokens, counts)}


# Files whose row groups are the shards' own (encoded by the shard tasks, appended as bytes): byte for byte the
# same for the same shards on any runner, the same rows for any shards.
ROW_GROUPS_BY_SHARD = {"documents.parquet", "termdoc.parquet", "tokens.parquet"}


def assert_same_artifacts(a: dict, b: dict, same_shards: bool = True) -> None:
    """The same versions, rows and metrics; the same bytes too, but for ROW_GROUPS_BY_SHARD's files when
    the two were built with other shard sizes (`same_shards=False`)."""
    assert {k: r.version for k, r in a.items()} == {k: r.version for k, r in b.items()}
    for kind, ref in a.items():
        left, right = ArtifactStore(ref.store), ArtifactStore(b[kind].store)
        files = sorted(f["name"] for f in left.manifest(kind, ref.version)["files"])
        for name in files:
            if name.endswith(".parquet"):
                assert left.read_parquet(kind, ref.version, name).equals(right.read_parquet(kind, ref.version, name))
        assert left.manifest(kind, ref.version)["metrics"] == right.manifest(kind, ref.version)["metrics"]
        # Byte for byte too (sizes and SHA-256): the same rows in the same row groups.
        entries = [[f for f in store.manifest(kind, version)["files"] if same_shards or f["name"] not in
                    ROW_GROUPS_BY_SHARD] for store, version in ((left, ref.version), (right, b[kind].version))]
        assert entries[0] == entries[1]


@pytest.fixture()
def sources(tmp_path, files):
    """Text with duplicates across files and a file cut mid-line, a JSONL file, a gzip file."""
    big = tmp_path / "big.txt"
    big.write_text("\n".join(f"Sentence {i % 37} about cats. And dogs number {i % 11}!" for i in range(300)))
    return [str(big), str(files[0]), str(files[1]), str(files[2])]


def test_cooccurrence_counts_only_the_train_split(tmp_path, sources):
    # Embeddings built on these counts may initialise a language model; its held-out perplexity must not
    # have seen the held-out text. Known answer: the matrix of the train sentences' ids alone.
    outputs = stage_outputs(ArtifactStore(tmp_path / "store"), sources, ParallelParams())
    tokens = ArtifactStore(tmp_path / "store").read_parquet("tokenized_corpus", outputs["tokenized_corpus"].version,
                                                            "tokens.parquet")
    assert set(tokens["split"]) == {"train", "valid", "test"}
    train = tokens.with_columns(pl.when(pl.col("split") == "train").then(pl.col("ids")).alias("ids"))["ids"]
    ids, offsets = id_stream(train, min_id=len(SPECIALS))
    defaults = CooccurrenceParams(window=3)
    vocabulary = ArtifactStore(tmp_path / "store").read_parquet("tokenizer", outputs["tokenizer"].version,
                                                                "vocab.parquet")
    counts = vocabulary["count"].to_numpy().astype(float)
    counts[: len(SPECIALS)] = 0
    kept, kept_offsets = subsample(ids, offsets, keep_probabilities(counts, defaults.subsample), defaults.seed)
    expected = cooccurrence_matrix(kept, kept_offsets, vocabulary.height, window=3, weighting=defaults.weighting)
    assert np.array_equal(read_matrix(outputs["cooccurrence"]).toarray(), expected.toarray())


def test_sharded_stages_publish_the_same_artifacts_and_versions(tmp_path, sources):
    single = stage_outputs(ArtifactStore(tmp_path / "single"), sources, ParallelParams(runner="local"))
    small = ParallelParams(runner="local", shard_bytes=700, shard_rows=13)
    sharded_refs = stage_outputs(ArtifactStore(tmp_path / "sharded"), sources, small)
    assert_same_artifacts(single, sharded_refs, same_shards=False)
    groups = [pq.ParquetFile(ArtifactStore(tmp_path / name).path("tokenized_corpus", refs["tokenized_corpus"].version,
                                                                    "tokens.parquet")).num_row_groups
              for name, refs in (("single", single), ("sharded", sharded_refs))]
    assert groups[0] == 1 and groups[1] == len(shard_ranges(single["corpus"], "documents.parquet", small)) > 5
    metrics = ArtifactStore(tmp_path / "single").manifest("cooccurrence", single["cooccurrence"].version)["metrics"]
    assert metrics["documents"] > 50 and metrics["tokens"] > 1000
    assert 0 < metrics["tokens_after_subsampling"] < metrics["tokens"]  # frequent words were subsampled
    corpus_manifest = ArtifactStore(tmp_path / "single").manifest("corpus", single["corpus"].version)
    assert "parallel" not in corpus_manifest["parameters"]
    tokens = pl.read_parquet(ArtifactStore(tmp_path / "sharded").path("tokenized_corpus",
                                                                       sharded_refs["tokenized_corpus"].version,
                                                                       "tokens.parquet"))
    assert tokens["doc_index"].is_sorted() and tokens["doc_index"].n_unique() == tokens["doc_index"].max() + 1
    train = tokens.with_columns(pl.when(pl.col("split") == "train").then(pl.col("ids")).alias("ids"))
    ids, offsets = id_stream(train["ids"], min_id=4)
    assert len(ids) == metrics["tokens"] < len(id_stream(tokens["ids"], min_id=4)[0])  # the train split's
    # The term–document matrix equals the one built from whole documents (sentences regrouped).
    per_doc = train.group_by("doc_index", maintain_order=True).agg(pl.col("ids").explode().drop_nulls())["ids"]
    doc_ids, doc_offsets = id_stream(per_doc, min_id=4)
    expected = term_document_reference(doc_ids, doc_offsets, metrics["vocabulary_size"])
    got = read_matrix(sharded_refs["cooccurrence"], "termdoc.parquet")
    assert got.shape == expected.shape and (got != expected).nnz == 0


def test_shards_encode_the_documents_no_other_shard_has(tmp_path):
    """A shard's term–document rows come as its first document's rows, the inner documents' row groups encoded
    by the shard (a `Segment`), and its last document's rows (`termdoc_pieces`); the merged file holds the whole
    matrix, the documents cut by shard boundaries added, and each shard's inner rows as its own row groups."""
    rng = np.random.default_rng(2)
    whole = sp.random(40, 30, density=0.3, random_state=3, format="csc")
    whole.data = rng.integers(1, 5, whole.nnz).astype(float)
    edges = [0, 7, 7, 8, 19, 30]  # columns per shard: one empty, one of a single document
    shards = []
    for a, b in zip(edges, edges[1:], strict=False):
        block = sp.lil_matrix(whole.shape)
        block[:, a:b] = whole[:, a:b]
        if b < 30 and b > a:  # the shard boundary cuts document b in two halves
            block[:, b] = whole[:, b] / 2
        if a > 0 and b > a:
            block[:, a] = whole[:, a] / 2 if a in edges[1:-1] else whole[:, a]
        shards.append(by_columns(block.tocsr()))
    pieces = [termdoc_pieces(columns, None, whole.shape) for columns in shards]
    assert [tuple(type(p).__name__ for p in shard) for shard in pieces] == [
        ("DataFrame", "Segment", "DataFrame"), (), ("DataFrame", "DataFrame"), ("DataFrame", "Segment", "DataFrame"),
        ("DataFrame", "Segment", "DataFrame")]
    store = ArtifactStore(tmp_path)
    with store.writer("cooccurrence", "aa" * 8) as out:
        write_matrix_columns(out, "termdoc.parquet", [p for shard in pieces for p in shard], whole.shape)
    got = read_matrix(ArtifactRef(store=str(tmp_path), kind="cooccurrence", version="aa" * 8), "termdoc.parquet")
    assert got.shape == whole.shape and (got != whole).nnz == 0
    table = pq.ParquetFile(store.path("cooccurrence", "aa" * 8, "termdoc.parquet"))
    inner = [p.rows for shard in pieces for p in shard if not isinstance(p, pl.DataFrame)]
    sizes = [table.metadata.row_group(i).num_rows for i in range(table.num_row_groups)]
    assert all(rows in sizes for rows in inner) and len(sizes) == 2 * len(inner) + 1  # boundaries between


def test_column_blocks_that_share_a_column_write_the_bytes_of_the_whole(tmp_path):
    """A term–document matrix arrives as shards' column blocks; a document cut by shard boundaries (here
    column 2, spread over three blocks, one of them nothing else) has its counts added, in row order."""
    rng = np.random.default_rng(0)
    whole = sp.random(9, 6, density=0.6, random_state=1, format="csr")
    whole.data = 3.0 * rng.integers(1, 5, whole.nnz)  # counts in thirds stay integers: sums are exact
    # Column 2 split into three partial columns, plus an empty block: their sum is `whole`.
    third = whole[:, 2].toarray().ravel() / 3
    cuts = [whole[:, :3].tolil(), sp.lil_matrix(whole.shape), sp.lil_matrix(whole.shape), whole.tolil()]
    cuts[0][:, 2] = third[:, None]
    cuts[1][:, 2] = third[:, None]
    cuts[3][:, :2] = 0
    cuts[3][:, 2] = third[:, None]
    blocks = [by_columns(c.tocsr()) for c in (cuts[0], cuts[1], sp.csr_matrix(whole.shape), cuts[3])]
    assert sum(b.height for b in blocks) > whole.nnz  # the cut column's entries are in three blocks
    store = ArtifactStore(tmp_path)
    with store.writer("cooccurrence", "aa" * 8) as out:
        write_matrix_columns(out, "parts.parquet", [blocks[0], blocks[1].lazy(), blocks[2], blocks[3]], whole.shape)
        write_matrix_columns(out, "whole.parquet", [by_columns(whole)], whole.shape)
    ref = ArtifactRef(store=str(tmp_path), kind="cooccurrence", version="aa" * 8)
    files = {f["name"]: f for f in store.manifest("cooccurrence", "aa" * 8)["files"]}
    assert files["parts.parquet"]["sha256"] == files["whole.parquet"]["sha256"]
    got = read_matrix(ref, "parts.parquet")
    assert np.allclose(got.toarray(), whole.toarray()) and got.shape == whole.shape
    table = pl.read_parquet(store.path("cooccurrence", "aa" * 8, "parts.parquet"))
    assert table.select(["col", "row"]).equals(table.select(["col", "row"]).sort(["col", "row"]))  # column-major


def test_document_shards_hold_shard_bytes_of_the_table_whatever_the_documents_length(tmp_path):
    # Rows are no measure of work for documents (a few words to a book): by default a shard holds
    # ~shard_bytes of the table. 2 000 distinct documents of 1 000 bytes (~2 MB uncompressed: each row's text,
    # its 4-byte length and a share of page headers) make 8 shards of 256 KiB, ~261 rows at most each; the
    # same number of 10-byte documents is one shard.
    store = ArtifactStore(tmp_path)
    rng = np.random.default_rng(0)
    long = ["".join(rng.choice(list("abcdefgh "), size=1000)) for _ in range(2000)]
    with store.writer("corpus", "a" * 16) as out:
        out.write_parquet("long.parquet", pl.DataFrame({"text": long}), row_group_size=100)
        out.write_parquet("short.parquet", pl.DataFrame({"text": [f"doc {i:6d}" for i in range(2000)]}))
    ref, by_bytes = store.ref("corpus", "a" * 16), ParallelParams(shard_bytes=256 << 10)
    ranges = shard_ranges(ref, "long.parquet", by_bytes)
    assert len(ranges) == 8 and 250 <= ranges[0][1] <= (256 << 10) // 1004 and ranges[-1][1] == 2000
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, in order
    assert shard_ranges(ref, "short.parquet", by_bytes) == [(0, 2000)]
    # Set rows win over both the stage's own count (co-occurrence: sentences) and the byte size; 2000 rows at
    # most 800 each need 3 shards, made 4 (`shard_count`) of equal size (not 800, 800 and a short 400).
    assert shard_ranges(ref, "short.parquet", by_bytes, rows_per_shard=800) == [(0, 500), (500, 1000), (1000, 1500),
                                                                                (1500, 2000)]
    assert shard_ranges(ref, "short.parquet", by_bytes, rows_per_shard=1999) == [(0, 1000), (1000, 2000)]
    assert len(shard_ranges(ref, "long.parquet", ParallelParams(shard_bytes=256 << 10, shard_rows=1000),
                            rows_per_shard=800)) == 2


def test_shard_counts_let_1_2_4_and_8_workers_end_their_last_wave_together():
    # The scaling benchmark's 1 GB of text in 64 MiB shards needs 15 (ingestion), its sentences in shards
    # of 500 000 need 14 (co-occurrence): both become 16, two full waves of 8 workers.
    needed = [1, 2, 3, 4, 5, 8, 9, 14, 15, 16, 17, 100]
    assert [shard_count(n, 1) for n in needed] == [1, 2, 4, 4, 8, 8, 16, 16, 16, 16, 24, 104]
    assert shard_count(int(1e9), 64 << 20) == 16 and shard_count(0, 10) == 1
    for total, most in [(0, 5), (7, 5), (1000, 64), (10**9 + 7, 64 << 20)]:
        ranges = equal_ranges(total, most)
        sizes = [b - a for a, b in ranges]
        assert ranges[0][0] == 0 and ranges[-1][1] == total and max(sizes) - min(sizes) <= 1 and max(sizes) <= most
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_shard_cuts_move_to_a_near_row_group_start_and_stay_in_order():
    # 4 shards of 238 000 rows over the row groups a 256 MB corpus's ingestion wrote (59 980, 57 729, 60 304,
    # 59 987 rows): each cut is within 1/32 of a shard (1 859 rows) of a group start, so the shards are the groups.
    ranges = equal_ranges(238_000, 60_000)
    assert ranges == [(0, 59500), (59500, 119000), (119000, 178500), (178500, 238000)]
    assert aligned(ranges, [59980, 117709, 178013]) == [(0, 59980), (59980, 117709), (117709, 178013),
                                                        (178013, 238000)]
    # A start farther than the slack leaves the cut; no group boundary, or one range, leaves them all.
    assert aligned([(0, 100), (100, 200)], [96]) == [(0, 100), (100, 200)]
    assert aligned([(0, 100), (100, 200)], [97]) == [(0, 97), (97, 200)]
    assert aligned([(0, 100), (100, 200)], []) == [(0, 100), (100, 200)] and aligned([(0, 9)], [4]) == [(0, 9)]
    # Group starts every 7 rows, shards of ~25 and a slack of 0.45: every cut moves (by 3 rows at most), in
    # order, none empty.
    moved = aligned(equal_ranges(1000, 25), list(range(7, 1000, 7)), slack=0.45)
    assert all(a < b for a, b in moved) and moved[0][0] == 0 and moved[-1][1] == 1000
    assert all(a[1] == b[0] and a[1] % 7 == 0 for a, b in zip(moved, moved[1:], strict=False))


def test_row_partitions_interleave_and_add_back_to_the_matrix():
    matrix = sp.random(11, 40, density=0.3, random_state=2, format="csr")
    matrix.data = np.arange(1, matrix.nnz + 1, dtype=np.int64)
    blocks = row_partitions(matrix, 3)
    for p, block in enumerate(blocks):
        assert block.shape == matrix.shape
        assert set(block.nonzero()[0]) == {r for r in matrix.nonzero()[0] if r % 3 == p}
    assert (sum_matrices(blocks) != matrix).nnz == 0


def test_blocks_of_disjoint_rows_join_into_the_matrix_they_came_from():
    """`join_rows` (the co-occurrence stage's join of its partition merges) moves each row's entries: the
    same arrays, bit for bit, as the matrix the rows came from, and as their sum; rows two blocks share are
    refused (they need adding)."""
    matrix = sp.random(300, 500, density=0.05, random_state=4, format="csr")
    matrix.data = np.random.default_rng(0).random(matrix.nnz)  # floats: a moved value is the same bits
    for partitions in (1, 2, 7):
        joined = join_rows(row_partitions(matrix, partitions))
        for got, want in ((joined, matrix), (joined, sum_matrices(row_partitions(matrix, partitions)))):
            assert got.shape == want.shape and got.has_sorted_indices
            assert all(np.array_equal(getattr(got, a), getattr(want, a)) for a in ("indptr", "indices", "data"))
    assert join_rows([sp.csr_matrix((3, 4)), sp.csr_matrix((3, 4))]).nnz == 0
    with pytest.raises(ValueError, match="same row"):
        join_rows([matrix, matrix[:, ::-1].tocsr()])


def test_matrix_parts_come_back_exactly_in_half_the_bytes_where_values_fit_int32(tmp_path):
    """A shard's counts cross processes as int32 triplets (the same entries, read back int64 so that sums of
    them stay exact); counts past int32, float weights and unsorted or duplicate entries come back as given."""
    from lexiflow.tasks.parts import Part, deliver, deliver_partitions, received

    counts = sp.random(50, 3000, density=0.05, random_state=3, format="csr")
    counts.data = np.arange(1, counts.nnz + 1, dtype=np.int64)
    wide = counts.copy()
    wide.data[-1] = 2**40  # one count past int32: the values stay int64
    weights = sp.csr_matrix(counts, dtype=np.float64) / 7
    messy = sp.csr_matrix((np.array([2, 3, 4], dtype=np.int64), np.array([5, 1, 5]), np.array([0, 3, 3])),
                          shape=(2, 9))  # row 0: columns 5, 1, 5 (unsorted, a duplicate)
    for name, matrix in {"counts": counts, "wide": wide, "weights": weights, "messy": messy,
                         "empty": sp.csr_matrix((4, 6), dtype=np.int64)}.items():
        back = received(deliver(matrix, str(tmp_path / "shard"), name))
        assert back.shape == matrix.shape and back.dtype == matrix.dtype, name
        assert (back != matrix).nnz == 0 and back.has_canonical_format, name
    assert received(Part(str(tmp_path / "shard-messy.arrow"))).toarray()[0].tolist() == [0, 3, 0, 0, 0, 6, 0, 0, 0]
    size = {name: (tmp_path / f"shard-{name}.arrow").stat().st_size for name in ("counts", "wide")}
    # bytes an entry: 4 + 4 + 4 (int64 triplets were 24), and 4 + 4 + 8 with the count past int32
    assert 12 * counts.nnz < size["counts"] < 13 * counts.nnz and 16 * counts.nnz < size["wide"] < 17 * counts.nnz
    blocks = row_partitions(counts, 3)
    for block, part in zip(blocks, deliver_partitions(blocks, str(tmp_path / "parts"), "pairs"), strict=True):
        assert (received(part) != block).nnz == 0


def test_a_concurrent_build_of_the_same_version_leaves_this_builds_shard_parts(tmp_path, monkeypatch):
    """Shard parts (processes and dask runners) live in the writer's own work folder: another run
    building the same version meanwhile neither clears them when it starts nor removes them at its end."""
    from lexiflow.tasks import parallel, runners
    from lexiflow.tasks.parts import deliver

    def shard(rows: list[int], part: str | None):
        return deliver(pl.DataFrame({"x": rows}), part)

    version, calls, others, started = "ab" * 8, [{"rows": [1, 2]}, {"rows": [3]}], [], []
    processes = ParallelParams(runner="processes")

    class Pool(concurrent.futures.Executor):
        """Runs each shard when submitted; before the second, another run builds the same version."""

        def submit(self, fn, *args):
            if args[1]["rows"] == [3] and not started:
                started.append(True)
                with ArtifactStore(tmp_path).writer("corpus", version) as other:
                    others.append(parallel.map_shards(shard, calls, processes, "other", other))
                    other.write_text("a.txt", "the other run")
            future = concurrent.futures.Future()
            future.set_result(fn(*args))
            return future

    monkeypatch.setattr(runners, "process_pool", lambda workers: Pool())
    with ArtifactStore(tmp_path).writer("corpus", version) as out:
        results = parallel.map_shards(shard, calls, processes, "ours", out)
        out.write_text("a.txt", "the other run")
    assert [r["x"].to_list() for r in results] == [[1, 2], [3]]
    assert [[r["x"].to_list() for r in rs] for rs in others] == [[[1, 2], [3]]]


def test_seen_ids_keep_the_first_copy_within_and_across_batches():
    from lexiflow.models.ingest.sharding import _SeenIds

    seen = _SeenIds()
    batch = pl.Series(["ffffffffffffffff", "0000000000000001", "ffffffffffffffff", "8000000000000000"])
    assert seen.first_copies(batch).tolist() == [True, True, False, True]
    later = pl.Series(["0000000000000002", "8000000000000000", "0000000000000002", "0000000000000001"])
    assert seen.first_copies(later).tolist() == [True, False, False, False]
    assert seen.first_copies(pl.Series([], dtype=pl.String)).tolist() == []
    assert seen.sorted.tolist() == sorted(int(x, 16) for x in {*batch, *later})


def flaky_shard(marks: str, error: str, part: str | None) -> int:
    """Fails with `error` on its first two attempts (one file per attempt in `marks`), then returns them."""
    attempts = len(list(Path(marks).iterdir())) + 1
    (Path(marks) / str(attempts)).touch()
    if attempts <= 2:
        raise OSError("the disk went away") if error == "transient" else ValueError("no numbers in rows 0-10")
    return attempts


@pytest.mark.parametrize("runner", ["threads", "processes"])
def test_a_shard_is_retried_where_it_ran_on_transient_errors_only(tmp_path, monkeypatch, runner):
    from lexiflow.tasks import parallel, runners

    monkeypatch.setattr(runners, "SHARD_RETRY_DELAYS", (0.0, 0.0))  # the pool's threads read it; processes: (1, 2)
    params = ParallelParams(runner=runner, workers=2)
    for error, outcome in (("transient", [3, 3]), ("bad input", None)):
        folders = [tmp_path / runner / error / str(i) for i in range(2)]
        for folder in folders:
            folder.mkdir(parents=True)
        calls = [{"marks": str(folder), "error": error} for folder in folders]
        with ArtifactStore(tmp_path / "store").writer("corpus", "ab" * 8) as out:
            if outcome is not None:
                assert parallel.map_shards(flaky_shard, calls, params, "flaky", out) == outcome
            else:
                with pytest.raises(runners.ShardError, match=r"^flaky shard \d/2 failed: ValueError: no numbers"):
                    parallel.map_shards(flaky_shard, calls, params, "flaky", out)
        attempts = [len(list(folder.iterdir())) for folder in folders]
        assert attempts == [3, 3] if outcome else 1 in attempts and max(attempts) == 1  # bad input: never again
