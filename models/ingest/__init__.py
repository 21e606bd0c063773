"""Corpus ingestion: read sources of many formats into clean documents with a stable split.

Sources are files, directories (read recursively, sorted) or glob patterns, plus the built-in
`builtin:enwiki` (gensim's bundled Wikipedia dump excerpt, the default corpus) and `builtin:lee`.
The format follows the name, after an optional `.gz`/`.bz2`:

| ending | format | a document is |
| --- | --- | --- |
| `.txt`, anything else | UTF-8 plain text | a line (default), a blank-line paragraph, or the file (`text_unit`) |
| `.jsonl`, `.ndjson` | JSON lines | the `text_field` of each object |
| `.parquet` | Parquet | the `text_field` column of each row |
| `.conllu` | CoNLL-U | a sentence (its words; tags go to the tagged corpus) |
| `.xml` or `<mediawiki` content | MediaWiki XML dump | an article (namespace 0, no redirects, markup stripped) |

Text is cleaned by `models.text.clean_series` (NFC, whitespace, sentence split, optional
lowercase). Exact duplicates (after cleaning) are dropped, keeping the first. Each document's id is
the SHA-1 of its cleaned text (16 hex digits); its split comes from that id (so a document keeps
its split across rebuilds), except in files whose name gives a split, which is then the file's: a
split word (`train`; `dev`, `valid` or `validation`; `test`) that starts or ends a dot-separated part
of the name, cut at `-`/`_` (`train.txt`, `en_ewt-ud-dev.conllu`, `wiki.test.tokens`,
`validation-00000-of-00001.parquet`). One in the middle of a part (`my_test_notes.txt`) or inside a
word (`latest.txt`) is just part of the name.

Policy on bad input (see docs/reliability.md). Every problem is one line naming the file, and
the line where there is one; nothing is published from a failed ingestion.

- Encodings: text must be UTF-8 (a UTF-8 BOM is dropped). Files that start with a UTF-16/UTF-32
  BOM are decoded as such. Anything else that is not valid UTF-8, including a file that mixes
  encodings, is rejected (never silently replaced): `file:line: invalid UTF-8`.
- A NUL byte in the first 8 KiB (without a UTF-16/32 BOM) marks a binary file: rejected.
- Compressed files: a truncated or corrupt `.gz`/`.bz2` is rejected; so is a file that
  decompresses to more than `max_file_bytes`, or to more than 100 times its size past 16 MiB (a
  decompression bomb), checked while it streams.
- MediaWiki XML must be well-formed with a `<mediawiki>` root (`file:line: not well-formed XML`);
  entity-expansion bombs are refused by the XML parser (expat ≥ 2.4).
- JSONL: invalid JSON, nesting too deep to parse, or a line without a string `text_field` is
  rejected with its line number. Parquet: a damaged file, or no string `text_field` column.
- CoNLL-U: a line without 10 columns or with an out-of-sequence/non-integer ID is rejected.
- Lines have no length limit: a single 200 MB line is one document (memory ~13× its size).
- Streaming (`readers.read_chunks`): plain-text lines, JSONL, MediaWiki XML and Parquet are read in
  chunks of about `parallel.shard_bytes` of text (whole lines, pages, rows), compressed or not, and
  cleaned a batch at a time; a shard whose batches are several spills them to part files
  (`ingest_shard(spill=...)`), so memory follows the shard size, not the file. The corpus is the
  same, row for row, as reading each file whole, and so are its errors (a read
  error first, then the first invalid UTF-8, then the first bad JSON line). CoNLL-U, paragraph and
  file units, UTF-16/32 text and `.parquet.gz` are still read whole, within `max_file_bytes`.
- An empty file (or one with no document) is skipped and listed in the stats' `skipped`.
- `bad_files="skip"` turns each per-file rejection above into a skip: the file is left out and
  listed in `skipped` with the one-line reason (the corpus stats count them in `skipped_inputs`).
  A missing source or an empty corpus still fails.

Sharding (for many workers; `plan_shards`, `ingest_shard`, `merge_shards`): a large uncompressed
plain-text (one document per line) or JSONL file is cut into byte ranges; a range owns the lines
that *start* inside it, so it reads from the first line start at or after its first byte to the
first line start at or after its end. A large Wikipedia multistream dump with its index beside it
is cut into ranges of whole bz2 streams (`multistream`). Other files (compressed, XML, Parquet,
CoNLL-U, UTF-16/32, paragraph/file units) are one shard each when large (streamed in chunks; a log
line says why), small ones grouped into one shard. Each shard reads and
cleans its documents; the merge puts the shards back in file/offset order, applies the bad-file
policy per file and removes duplicates keeping the first, so the corpus is the same, row for row,
as `build_corpus`'s (which is the merge of one shard holding every file). An error in a range
names the file's line (newlines before the range are counted only then) and absolute byte; for a
file cut in ranges, decoding errors come before JSON errors, as when the file is read whole.

Modules, in reading order: `sources` (options, resolving sources, formats and splits by name,
fingerprints), `readers` (one file's raw documents, per format, whole or in chunks), `multistream`
(Wikipedia multistream dumps: the index, stream ranges), `stats` (corpus statistics), `sharding`
(shards, cleaning, the merge: the corpus and the tagged corpus).
"""

from lexiflow.models.ingest.multistream import Streams
from lexiflow.models.ingest.readers import read_chunks, read_file
from lexiflow.models.ingest.sharding import (
    DOCUMENT_COLUMNS,
    Corpus,
    FileRange,
    ShardResult,
    build_corpus,
    build_tagged,
    first_in_table,
    ingest_shard,
    iter_files,
    merge_shards,
    plan_shards,
)
from lexiflow.models.ingest.sources import (
    BUILTIN,
    SPLITS,
    IngestOptions,
    fingerprint,
    no_train_split,
    resolve_sources,
    tagged_files,
)
from lexiflow.models.ingest.stats import CorpusCounts

__all__ = ["BUILTIN", "DOCUMENT_COLUMNS", "SPLITS", "Corpus", "CorpusCounts", "FileRange", "IngestOptions",
           "ShardResult", "Streams", "build_corpus", "build_tagged", "fingerprint", "first_in_table", "ingest_shard",
           "iter_files", "merge_shards", "no_train_split", "plan_shards", "read_chunks", "read_file", "resolve_sources",
           "tagged_files"]
