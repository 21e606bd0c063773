"""Parquet files of whole row groups joined byte for byte (storage/parquet_concat.py, and the writers built on it:
`ArtifactWriter.parquet_parts`, `write_matrix`): the known answer is pyarrow's own file of the same rows,
written in one go."""

import hashlib
import io
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.storage.formats import MATRIX_ROW_GROUP, matrix_schema, read_matrix, write_matrix
from lexiflow.storage.parquet_concat import ParquetAssembler, ParquetConcatError, Segment, write_row_groups
from lexiflow.storage.writer import PARQUET_OPTIONS

ROWS = 5000


def table(n: int = ROWS, seed: int = 0) -> pa.Table:
    """Rows like the pipeline's tables: integers, a few strings (dictionary pages), lists of ids with nulls
    and empty lists, long texts."""
    rng = np.random.default_rng(seed)
    ids = [None if i % 97 == 0 else rng.integers(0, 3000, rng.integers(0, 30)).tolist() for i in range(n)]
    return pa.table({
        "doc_index": pa.array(np.arange(n) // 3, pa.uint32()),
        "split": pa.array(rng.choice(["train", "dev", "test"], n)),
        "ids": pa.array(ids, pa.list_(pa.uint32())),
        "text": pa.array([" ".join(["word"] * int(k)) or None for k in rng.integers(0, 40, n)], pa.large_string()),
        "score": pa.array(rng.normal(size=n)),
    })


def parquet(rows: pa.Table, row_group_size: int) -> bytes:
    sink = io.BytesIO()
    write_row_groups(sink, rows, row_group_size, **PARQUET_OPTIONS)
    return sink.getvalue()


def assembled(files: list[bytes]) -> bytes:
    sink = io.BytesIO()
    assembler = ParquetAssembler(sink)
    for data in files:
        assembler.append(io.BytesIO(data))
    assembler.close()
    return sink.getvalue()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, ROWS // 1000 - 1), max_size=4, unique=True), st.sampled_from([250, 500, 1000]))
def test_row_groups_appended_are_the_bytes_of_one_writer(cuts, row_group_size):
    """Files holding consecutive whole row groups, appended, are the file pyarrow writes of all the rows."""
    whole = table()
    bounds = [0, *sorted(cut * 1000 for cut in cuts), ROWS]  # on row-group boundaries of every size drawn
    files = [parquet(whole.slice(a, b - a), row_group_size) for a, b in zip(bounds, bounds[1:], strict=False)]
    joined = assembled(files)
    assert joined == parquet(whole, row_group_size)
    read = pq.ParquetFile(io.BytesIO(joined), page_checksum_verification=True)
    assert read.metadata.num_rows == ROWS and read.metadata.num_row_groups == -(-ROWS // row_group_size)
    assert read.read().equals(whole)


def test_files_of_any_length_keep_their_row_groups_and_rows():
    """Not on a boundary of the whole: each file's groups stay as written (a shard's own row groups), the
    offsets still right: every group reads back, page checksums verified."""
    whole = table()
    bounds = [0, 1234, 1300, 4999, ROWS]
    joined = assembled([parquet(whole.slice(a, b - a), 1000) for a, b in zip(bounds, bounds[1:], strict=False)])
    read = pq.ParquetFile(io.BytesIO(joined), page_checksum_verification=True)
    assert [read.metadata.row_group(i).num_rows for i in range(read.num_row_groups)] == [1000, 234, 66, 1000,
                                                                                         1000, 1000, 699, 1]
    assert pa.concat_tables([read.read_row_group(i) for i in range(read.num_row_groups)]).equals(whole)
    assert pl.read_parquet(io.BytesIO(joined)).equals(pl.from_arrow(whole))  # another reader


def test_an_empty_file_gives_the_schema_and_no_rows():
    empty = io.BytesIO()
    pq.ParquetWriter(empty, table().schema, **PARQUET_OPTIONS).close()
    assert assembled([empty.getvalue()]) == empty.getvalue()
    assert assembled([empty.getvalue(), parquet(table(), 1000)]) == parquet(table(), 1000)
    with pytest.raises(ParquetConcatError, match="no Parquet file was appended"):
        ParquetAssembler(io.BytesIO()).close()


def test_what_cannot_be_appended_is_refused_naming_the_file():
    whole = table()
    other = whole.rename_columns(["doc", *whole.column_names[1:]])
    sink = ParquetAssembler(io.BytesIO())
    sink.append(io.BytesIO(parquet(whole, 1000)), "first")
    with pytest.raises(ParquetConcatError, match="^second: another schema"):
        sink.append(io.BytesIO(parquet(other, 1000)), "second")
    for junk in (b"PAR1 but not really a Parquet file", b"PAR1", b""):
        with pytest.raises(ParquetConcatError, match="^third: not a Parquet file"):
            sink.append(io.BytesIO(junk), "third")
    indexed = io.BytesIO()
    pq.write_table(whole, indexed, write_page_index=True, **PARQUET_OPTIONS)
    with pytest.raises(ParquetConcatError, match="^fourth: has page indexes"):
        sink.append(io.BytesIO(indexed.getvalue()), "fourth")


def test_parquet_parts_mixes_tables_and_segments(tmp_path):
    """`ArtifactWriter.parquet_parts`: tables are regrouped; a segment (row groups encoded elsewhere, in
    memory or in a file) is appended as it is and ends the row group before it."""
    whole = table()
    segment_file = tmp_path / "segment.parquet"
    segment_file.write_bytes(parquet(whole.slice(2000, 1500), 1000))
    with ArtifactStore(tmp_path / "store").writer("tokenized_corpus", "ab" * 8) as out:
        with out.parquet_parts("t.parquet", whole.schema, 1000) as write:
            write(pl.from_arrow(whole.slice(0, 700)))
            write(whole.slice(700, 1300))  # 2000 rows in tables: two groups of 1000
            write(Segment(str(segment_file), 1500))  # 1000 + 500
            write(whole.slice(3500, 300))  # a group of 300 ends at the next segment
            write(Segment(parquet(whole.slice(0, 0), 1000), 0))  # no rows: no (empty) row group either
            write(Segment(parquet(whole.slice(3800, ROWS - 3800), 1000), ROWS - 3800))  # 1000 + 200
        path = out.path("t.parquet")
        read = pq.ParquetFile(path, page_checksum_verification=True)
        assert [read.metadata.row_group(i).num_rows for i in range(read.num_row_groups)] == [1000, 1000, 1000,
                                                                                             500, 300, 1000, 200]
        assert read.read().equals(whole)


def test_more_row_groups_than_an_i16_counts_are_numbered_as_pyarrow_numbers_them():
    """A row group's ordinal is a Thrift i16; pyarrow's writer wraps it past 32 767 groups, and so does the
    append (the same bytes, and a file pyarrow reads)."""
    n = 33_000
    whole = pa.table({"x": pa.array(range(n), pa.uint32())})
    joined = assembled([parquet(whole.slice(0, 20_000), 1), parquet(whole.slice(20_000), 1)])
    assert joined == parquet(whole, 1)
    assert pq.read_table(io.BytesIO(joined)).equals(whole)


@pytest.mark.parametrize("threads", [1, 3])
def test_a_matrix_written_row_group_by_row_group_in_threads_is_one_writers_file(tmp_path, threads):
    """`write_matrix` encodes its row groups `threads` at a time and appends them: the bytes pyarrow writes of
    the matrix's (row, col, value) rows in one go; the manifest's sha256, taken as the file was written, is
    the file's."""
    matrix = sp.random(2000, 3000, density=0.4, format="csr", random_state=5)  # 2.4 M entries: 3 row groups
    rows = pa.table({"row": np.repeat(np.arange(2000, dtype=np.uint32), np.diff(matrix.indptr)),
                     "col": matrix.indices.astype(np.uint32), "value": matrix.data}, schema=matrix_schema(matrix.shape))
    store = ArtifactStore(tmp_path / "store")
    with store.writer("ppmi", "ab" * 8) as out:
        write_matrix(out, "matrix.parquet", matrix, threads)
    data = (Path(store.path("ppmi", "ab" * 8)) / "matrix.parquet").read_bytes()
    assert data == parquet(rows, MATRIX_ROW_GROUP) and pq.ParquetFile(io.BytesIO(data)).num_row_groups == 3
    (entry,) = store.manifest("ppmi", "ab" * 8)["files"]
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
    assert (read_matrix(ArtifactRef(store=str(tmp_path / "store"), kind="ppmi", version="ab" * 8)) != matrix).nnz == 0


def test_a_file_changed_after_it_was_hashed_is_hashed_again(tmp_path):
    """The digest taken while `parquet_parts` wrote a file stands only while the file is the one written."""
    store = ArtifactStore(tmp_path / "store")
    with store.writer("ppmi", "cd" * 8) as out:
        with out.parquet_parts("t.parquet", table().schema, 1000) as write:
            write(table())
        out.write_parquet("t.parquet", table(100))  # the same name, other rows
    (entry,) = store.manifest("ppmi", "cd" * 8)["files"]
    data = (Path(store.path("ppmi", "cd" * 8)) / "t.parquet").read_bytes()
    assert entry["sha256"] == hashlib.sha256(data).hexdigest() and pq.read_table(io.BytesIO(data)).num_rows == 100
