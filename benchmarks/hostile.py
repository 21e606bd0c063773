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
        "bomb.txt.gz": (gzip.compress(b"\0" * (64 << 20)), f"bomb.txt.gz: more than {BOMB_LIMIT} bytes"),
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
    expected = {name: message for name, (_, message) in files.items()}
    expected["notext.parquet"] = "notext.parquet: no column 'text'"
    expected["inttext.parquet"] = "inttext.parquet: column 'text' holds int64, not text"
    return expected
