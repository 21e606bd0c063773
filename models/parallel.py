"""Parallel corpus ingestion: sentence pairs (source, target) for translation, with a stable split.

Formats, by file name (after an optional `.gz`/`.bz2`):

| source | a pair is |
| --- | --- |
| `.tsv` | a line `source<TAB>target` (the Tatoeba/ManyThings layout; later columns are ignored) |
| `.jsonl`, `.ndjson` | an object's `source_field` and `target_field` strings |
| `.parquet` | a row's `source_field` and `target_field` columns |
| `<stem>.<source_lang>` + `<stem>.<target_lang>` | line i of two line-aligned text files (`train.en`, `train.fr`) |

Other files (a README or ATTRIBUTION.txt beside the data) are ignored and listed in `stats["ignored_files"]`.

Text is normalized as the monolingual corpus is (`models.text.normalize_series`: NFC, whitespace runs to
one space, controls removed); case is kept unless `lowercase`. Exact duplicate pairs are dropped
(`dedupe`), keeping the first. A pair's split is its file's when the name gives one (`train.tsv`,
`news.dev.en`; see `models.ingest`), else it follows a hash of the *source* sentence, so every translation
of one sentence lands in the same split (no test sentence is seen in training under another translation).

Bad input, one line naming file and line: a TSV line without a tab, a pair with an empty side, invalid
UTF-8, invalid JSON or a missing field, two aligned files of different lengths, a text file without its
partner. With `bad_files="skip"` a malformed pair (no tab, empty side, invalid UTF-8, missing field) is
left out and counted (`stats["skipped_lines"]`, with the first few reasons); files that cannot be read at
all still fail.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl
import pyarrow.parquet as pq
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.ingest import _file_split, _format_of, _lines, _one_line, _read_bytes, resolve_sources
from lexiflow.models.text import normalize_series

PAIR_COLUMNS = ("pair_id", "source_file", "split", "source", "target")
_EXAMPLES = 5  # skipped-line reasons kept in the stats


@dataclass(frozen=True)
class ParallelOptions:
    source_lang: str = "src"  # file suffix of the source side of two aligned files (e.g. "en")
    target_lang: str = "tgt"  # ... and of the target side (e.g. "fr")
    source_field: str = "source"  # JSONL/Parquet field names
    target_field: str = "target"
    lowercase: bool = False
    dedupe: bool = True
    valid_fraction: float = 0.05
    test_fraction: float = 0.05
    max_file_bytes: int = 4 << 30
    bad_files: Literal["fail", "skip"] = "fail"

    def __post_init__(self) -> None:
        for name in ("valid_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ParameterError(f"parallel.{name}={getattr(self, name)}: must be in [0, 1)")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ParameterError("parallel.valid_fraction + test_fraction must leave a training split (< 1)")
        if self.bad_files not in ("fail", "skip"):
            raise ParameterError(f"parallel.bad_files={self.bad_files!r}: use 'fail' or 'skip'")
        if not self.source_lang or self.source_lang == self.target_lang:
            raise ParameterError(f"parallel.source_lang={self.source_lang!r} and target_lang={self.target_lang!r}: "
                                 "give two different file suffixes")


@dataclass
class ParallelCorpus:
    pairs: pl.DataFrame  # PAIR_COLUMNS
    stats: dict = field(default_factory=dict)

    def split(self, name: str) -> tuple[list[str], list[str]]:
        part = self.pairs.filter(pl.col("split") == name)
        return part["source"].to_list(), part["target"].to_list()


class _Skips:
    """Malformed pairs: raise (bad_files='fail') or count them with a few examples."""

    def __init__(self, mode: str) -> None:
        self.mode, self.count, self.examples = mode, 0, []

    def __call__(self, where: str, reason: str) -> None:
        message = f"{where}: {reason}"
        if self.mode != "skip":
            raise InputError(f"{message}; fix or remove the line, or set parallel.bad_files='skip'")
        self.count += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(message)


def _text_lines(path: Path, data: bytes, skip: _Skips) -> list[str | None]:
    """The file's lines; a line that is not valid UTF-8 is None (reported through `skip`)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return list(_lines(data.decode("utf-8")))
    except UnicodeDecodeError:
        pass
    out: list[str | None] = []
    for i, raw in enumerate(_lines(data.decode("latin-1")), start=1):  # latin-1 keeps byte positions of "\n"
        try:
            out.append(raw.encode("latin-1").decode("utf-8"))
        except UnicodeDecodeError as exc:
            skip(f"{path}:{i}", f"invalid UTF-8 (byte {exc.start} of the line); re-encode the file as UTF-8")
            out.append(None)
    return out


def _pair(where: str, src: object, tgt: object, skip: _Skips) -> tuple[str, str] | None:
    if not isinstance(src, str) or not isinstance(tgt, str):
        skip(where, "a side is not a string")
        return None
    if not src.strip() or not tgt.strip():
        skip(where, f"empty {'source' if not src.strip() else 'target'} side")
        return None
    return src, tgt


def _tsv_pairs(path: Path, data: bytes, skip: _Skips) -> list[tuple[int, str, str]]:
    out = []
    for i, line in enumerate(_text_lines(path, data, skip), start=1):
        if line is None or not line.strip():
            continue  # bad UTF-8 (reported) or a blank line
        cols = line.split("\t")
        if len(cols) < 2:
            skip(f"{path}:{i}", "no tab between source and target")
            continue
        if (p := _pair(f"{path}:{i}", cols[0], cols[1], skip)) is not None:
            out.append((i, *p))
    return out


def _jsonl_pairs(path: Path, data: bytes, o: ParallelOptions, skip: _Skips) -> list[tuple[int, str, str]]:
    out = []
    for i, line in enumerate(_text_lines(path, data, skip), start=1):
        if line is None or not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            skip(f"{path}:{i}", f"invalid JSON ({_one_line(exc)})")
            continue
        if not isinstance(obj, dict) or o.source_field not in obj or o.target_field not in obj:
            skip(f"{path}:{i}", f"no fields {o.source_field!r} and {o.target_field!r}; set parallel.source_field "
                                "and target_field")
            continue
        if (p := _pair(f"{path}:{i}", obj[o.source_field], obj[o.target_field], skip)) is not None:
            out.append((i, *p))
    return out


def _parquet_pairs(path: Path, data: bytes, o: ParallelOptions, skip: _Skips) -> list[tuple[int, str, str]]:
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # pyarrow raises several types for damaged files
        raise InputError(f"{path}: not a readable Parquet file ({_one_line(exc)})") from None
    missing = [f for f in (o.source_field, o.target_field) if f not in table.column_names]
    if missing:
        raise InputError(f"{path}: no column {missing[0]!r} (columns: {', '.join(table.column_names)}); "
                         "set parallel.source_field and target_field")
    out = []
    for i, (s, t) in enumerate(zip(table.column(o.source_field).to_pylist(),
                                   table.column(o.target_field).to_pylist(), strict=True), start=1):
        if (p := _pair(f"{path}: row {i}", s, t, skip)) is not None:
            out.append((i, *p))
    return out


def _aligned_pairs(src_path: Path, tgt_path: Path, o: ParallelOptions, skip: _Skips) -> list[tuple[int, str, str]]:
    src = _text_lines(src_path, _read_bytes(src_path, _format_of(src_path)[1], o.max_file_bytes), skip)
    tgt = _text_lines(tgt_path, _read_bytes(tgt_path, _format_of(tgt_path)[1], o.max_file_bytes), skip)
    if len(src) != len(tgt):
        raise InputError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: line-aligned files must "
                         "have one line per sentence on both sides")
    out = []
    for i, (s, t) in enumerate(zip(src, tgt, strict=True), start=1):
        if s is None or t is None:
            continue  # bad UTF-8, reported
        if (p := _pair(f"{src_path}:{i} / {tgt_path}:{i}", s, t, skip)) is not None:
            out.append((i, *p))
    return out


def _stem_and_lang(path: Path) -> tuple[str, str]:
    """`dir/train.en.gz` -> (`dir/train`, `en`)."""
    name = path.name
    for ext in (".gz", ".bz2"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    stem, _, lang = name.rpartition(".")
    return str(path.parent / stem), lang


def _units(files: list[Path], o: ParallelOptions, ignored: list[str]) -> list[tuple[str, Path, Path | None]]:
    """(format, file, partner) per pair source: TSV/JSONL/Parquet files alone, text files by stem pairs;
    other files go to `ignored`."""
    units, sides = [], defaultdict(dict)
    for path in files:
        name = path.name.lower().removesuffix(".gz").removesuffix(".bz2")
        fmt = _format_of(path)[0]
        if name.endswith(".tsv"):
            units.append(("tsv", path, None))
        elif fmt in ("jsonl", "parquet"):
            units.append((fmt, path, None))
        else:
            stem, lang = _stem_and_lang(path)
            if lang in (o.source_lang, o.target_lang):
                sides[stem][lang] = path
            else:
                ignored.append(str(path))
    for stem, pair in sides.items():
        if len(pair) != 2:
            have = next(iter(pair.values()))
            other = o.target_lang if o.source_lang in pair else o.source_lang
            raise InputError(f"{have}: its aligned partner {stem}.{other} is missing")
        units.append(("aligned", pair[o.source_lang], pair[o.target_lang]))
    return units


def _split_of(sources: pl.Series, o: ParallelOptions) -> pl.Series:
    u = pl.Series([int(hashlib.sha1(s.encode()).hexdigest()[:8], 16) / 2**32 for s in sources], dtype=pl.Float64)
    return (pl.select(pl.when(u < o.valid_fraction).then(pl.lit("valid"))
                      .when(u < o.valid_fraction + o.test_fraction).then(pl.lit("test"))
                      .otherwise(pl.lit("train")))).to_series()


def read_parallel(sources: list[str], options: ParallelOptions | None = None) -> ParallelCorpus:
    """All pairs of the sources (files, directories, globs), normalized, deduplicated and split."""
    o = options or ParallelOptions()
    files = resolve_sources(sources)
    skip, ignored = _Skips(o.bad_files), []
    units = _units(files, o, ignored)
    if not units:
        raise InputError(f"no parallel data in {', '.join(sources)}: use .tsv, .jsonl or .parquet files, or two "
                         f"aligned files <stem>.{o.source_lang} and <stem>.{o.target_lang} (set parallel.source_lang "
                         "and target_lang to their suffixes)")
    frames = []
    for fmt, path, partner in units:
        if fmt == "aligned":
            rows = _aligned_pairs(path, partner, o, skip)
        else:
            data = _read_bytes(path, _format_of(path)[1], o.max_file_bytes)
            rows = (_tsv_pairs(path, data, skip) if fmt == "tsv" else _jsonl_pairs(path, data, o, skip)
                    if fmt == "jsonl" else _parquet_pairs(path, data, o, skip))
        frames.append(pl.DataFrame({"line": [r[0] for r in rows], "source": [r[1] for r in rows],
                                    "target": [r[2] for r in rows]},
                                   schema={"line": pl.Int64, "source": pl.String, "target": pl.String})
                      .with_columns(source_file=pl.lit(str(path)), file_split=pl.lit(_file_split(path))))
    pairs = pl.concat(frames) if frames else pl.DataFrame()
    if pairs.is_empty():
        raise InputError(f"no sentence pairs in {', '.join(map(str, files))}"
                         + (f" ({skip.count} malformed lines skipped)" if skip.count else ""))
    for side in ("source", "target"):
        text = normalize_series(pairs[side])
        pairs = pairs.with_columns((text.str.to_lowercase() if o.lowercase else text).alias(side))
    pairs = pairs.filter((pl.col("source") != "") & (pl.col("target") != ""))  # only controls/space: now empty
    read = pairs.height
    if o.dedupe:
        pairs = pairs.unique(subset=["source", "target"], keep="first", maintain_order=True)
    pairs = pairs.with_columns(split=pl.col("file_split").fill_null(_split_of(pairs["source"], o)),
                               pair_id=pl.concat_str("source", pl.lit("\t"), "target").map_elements(
                                   lambda s: hashlib.sha1(s.encode()).hexdigest()[:16], return_dtype=pl.String))
    pairs = pairs.select(PAIR_COLUMNS)
    per_split = {s: int((pairs["split"] == s).sum()) for s in ("train", "valid", "test")}
    if per_split["train"] == 0:
        raise InputError(f"the parallel corpus has no train split (held out: {per_split}); add training pairs or "
                         "name files without a split word so that pairs are split by valid/test_fraction")
    stats = {"pairs": pairs.height, "duplicates": read - pairs.height, "per_split": per_split,
             "skipped_lines": skip.count, "skipped_examples": skip.examples, "ignored_files": ignored,
             "sources": [str(f) for f in files]}
    return ParallelCorpus(pairs, stats)
