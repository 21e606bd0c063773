"""Hostile input files, one per kind of bad input, with the message each must produce (shared by
tests/test_hostile_input.py, tests/test_reliability.py and benchmarks/reliability.py)."""

from __future__ import annotations

import bz2
import gzip
import os
from pathlib import Path

import polars as pl

BOMB_LIMIT = 32 << 20  # corpus.max_file_bytes used with these files; the bomb inflates to 64 MiB
_ENTITIES = "".join(f'<!ENTITY e{i} "{f"&e{i - 1};" * 10}">' for i in range(1, 10))
LAUGHS = (f'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e0 "lol">{_ENTITIES}]>'
          '<mediawiki><page><title>A</title><ns>0</ns><revision><text>&e9;</text></revision></page></mediawiki>'
          ).encode()  # "billion laughs": 10^9 × "lol" if the parser expanded it


def hostile_directory(folder: Path) -> dict[str, str]:
    """One file per kind of bad input, and what the error (or skip reason) must say about it."""
    folder.mkdir(parents=True, exist_ok=True)
    ns = b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
    noise = os.urandom(100_000).hex().encode()
    files = {
        "empty.txt": (b"", "no documents (empty file)"),
        "binary.txt": (bytes(range(256)) * 64, "binary.txt: looks like a binary file"),
        "invalid.txt": (b"fine\nbad \xc3\x28 byte\n", "invalid.txt:2: invalid UTF-8"),
        "mixed.txt": ("caf\u00e9 in UTF-8\n".encode() + "caf\u00e9 in Latin-1\n".encode("latin-1"),
                      "mixed.txt:2: invalid UTF-8"),
        "truncated.txt.gz": (gzip.compress(noise)[:4000], "truncated.txt.gz: cannot read"),
        "truncated.txt.bz2": (bz2.compress(noise)[:4000], "truncated.txt.bz2: cannot read"),
        "bomb.txt.gz": (gzip.compress(b"\0" * (64 << 20)), "bomb.txt.gz: decompresses to more than 100 times"),
        "bomb.txt.bz2": (bz2.compress(b"\0" * (40 << 20)), "bomb.txt.bz2: decompresses to more than 100 times"),
        "plenty.txt.gz": (gzip.compress(noise * 400), f"plenty.txt.gz: more than {BOMB_LIMIT} bytes once decompressed"),
        "newline\nname.txt": (b"fine\nbad \xff\n", "newline\\nname.txt':2: invalid UTF-8"),
        "escape\x1b[31mred.txt": (b"\0binary", "escape\\x1b[31mred.txt': looks like a binary file"),
        "garbled.xml": (ns + b"\n<page><title>A</title><ns>0</ns><revision><text>x</text></revision></page>\n<page><ti",
                        "garbled.xml:3: not well-formed XML"),
        "columns.conllu": (b"1\tA\t_\tX\t_\t_\t0\troot\t_\t_\n2\tB\t_\tX\n", "columns.conllu:2: expected 10"),
        "ids.conllu": (b"1\tA\t_\tX\t_\t_\t0\troot\t_\t_\nx\tB\t_\tX\t_\t_\t1\tdep\t_\t_\n",
                       "ids.conllu:2: token ID 'x'"),
        "fields.jsonl": (b'{"text": "ok"}\n{"title": "no text"}\n', "fields.jsonl:2: no string field 'text'"),
        "deep.jsonl": (b"[" * 100_000 + b"]" * 100_000 + b"\n", "deep.jsonl:1: JSON nested too deeply"),
        "notjson.jsonl": (b'{"text": "ok"}\n{"text": "unterminated\n', "notjson.jsonl:2: invalid JSON"),
        "laughs.xml": (LAUGHS, "laughs.xml:1: not well-formed XML (limit on input amplification"),
        "wrongroot.xml": (b"<html><body>not a dump</body></html>", "wrongroot.xml: root element <html> is not"),
        "garbage.parquet": (b"PAR1 this is not parquet PAR1", "garbage.parquet: not a readable Parquet file"),
    }
    for name, (content, _) in files.items():
        (folder / name).write_bytes(content)
    pl.DataFrame({"body": ["no text column"]}).write_parquet(folder / "notext.parquet")
    pl.DataFrame({"text": [1, 2, 3]}).write_parquet(folder / "inttext.parquet")
    with (folder / "large.txt").open("wb") as f:  # sparse: one byte over the limit, no disk used
        f.truncate(BOMB_LIMIT + 1)
    dictionary_bomb(folder / "dictbomb.parquet", value_bytes=1 << 20, rows=64)  # 64 MiB of text once decoded
    dictionary_bomb(folder / "rows.parquet", value_bytes=0, rows=BOMB_LIMIT // 16 + 1)
    expected = {name: message for name, (_, message) in files.items()}
    expected["notext.parquet"] = "notext.parquet: no column 'text'"
    expected["inttext.parquet"] = "inttext.parquet: column 'text' holds int64, not text"
    expected["large.txt"] = f"large.txt: {BOMB_LIMIT + 1} bytes, more than corpus.max_file_bytes ({BOMB_LIMIT})"
    expected["dictbomb.parquet"] = "dictbomb.parquet: column 'text' expands to more than corpus.max_file_bytes"
    expected["rows.parquet"] = f"rows.parquet: {BOMB_LIMIT // 16 + 1} rows"
    return expected


def dictionary_bomb(path: Path, value_bytes: int, rows: int) -> int:
    """A Parquet file whose text column repeats one dictionary value `rows` times: a few hundred bytes
    on disk, `value_bytes * rows` bytes of text once decoded. Returns the file's size."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array(["a" * value_bytes]))
    pq.write_table(pa.table({"text": column}), path, compression="zstd")
    return path.stat().st_size


def rewrite_manifest(store, kind: str, version: str, change) -> dict:
    """Change a published manifest in place, behind the store's back (`change(manifest)` edits the dict)."""
    import json

    manifest = json.loads(store.fs.cat_file(store.path(kind, version, "manifest.json")))
    change(manifest)
    store.fs.pipe_file(store.path(kind, version, "manifest.json"), json.dumps(manifest).encode())
    return manifest


def flip_byte(store, kind: str, version: str, name: str, where: float = 0.5) -> None:
    """One bit of an artifact's file changed, its size kept (what only checksums see)."""
    path = store.path(kind, version, name)
    data = bytearray(store.fs.cat_file(path))
    data[int(len(data) * where)] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
