"""Sources of a corpus: ingestion options, built-ins, directories and globs resolved to files, each
file's format and split from its name, and the fingerprint the corpus version follows."""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from lexiflow.models.errors import InputError, ParameterError, shown
from pydantic import Field

BUILTIN = {
    "builtin:enwiki": "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    "builtin:lee": "lee_background.cor",
}
SPLITS = ("train", "valid", "test")
_SPLIT_WORDS = {"train": "train", "dev": "valid", "valid": "valid", "validation": "valid", "test": "test"}


@dataclass(frozen=True)
class IngestOptions:
    """How files become documents. Annotated fields are the pipeline's `corpus.*` parameters
    (models/config.py); the sources themselves are the stage's."""

    lowercase: Annotated[bool, Field(description="Lowercase the text after sentence splitting.")] = True
    split_sentences: Annotated[bool, Field(description="Split documents into sentences (one per line).")] = True
    text_unit: Annotated[Literal["line", "paragraph", "file"], Field(
        description="What one document is in plain-text files.")] = "line"
    dedupe: Annotated[bool, Field(description="Drop exact duplicate documents (after cleaning).")] = True
    valid_fraction: Annotated[float, Field(ge=0, lt=0.5, description="Share of documents in the valid "
                                                                      "split.")] = 0.05
    test_fraction: Annotated[float, Field(ge=0, lt=0.5, description="Share of documents in the test split.")] = 0.05
    text_field: Annotated[str, Field(min_length=1, description="JSONL field / Parquet column holding the "
                                                               "text.")] = "text"
    # protects against decompression bombs
    max_file_bytes: Annotated[int, Field(ge=1, description="Largest decompressed file accepted, in bytes.")] = 4 << 30
    # a file that cannot be read: stop, or skip and count it
    bad_files: Annotated[Literal["fail", "skip"], Field(
        description="A file that cannot be read (binary, bad encoding, malformed, truncated): stop with its error, "
                    "or skip it and list it in the corpus stats.")] = "fail"

    def __post_init__(self) -> None:
        for name in ("valid_fraction", "test_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ParameterError(f"{name}={getattr(self, name)}: must be in [0, 1)")
        if self.text_unit not in ("line", "paragraph", "file"):  # a typo would silently read lines
            raise ParameterError(f"text_unit={self.text_unit!r}: use 'line', 'paragraph' or 'file'")
        if self.bad_files not in ("fail", "skip"):
            raise ParameterError(f"bad_files={self.bad_files!r}: use 'fail' or 'skip'")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ParameterError("valid_fraction + test_fraction must leave a training split (< 1)")


def gensim_data(name: str) -> Path:
    """A file of the test data gensim ships, found without importing gensim (seconds: smart_open, boto3), where
    `gensim.test.utils.datapath` finds it."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        raise ParameterError(f"built-in corpus {name!r} ships with gensim, which is not installed: pip install gensim")
    return Path(spec.origin).parent / "test" / "test_data" / name


def resolve_sources(sources: list[str]) -> list[Path]:
    """Expand built-ins, directories and globs into a sorted, de-duplicated list of files (without the
    multistream index of a dump among them: it says where the dump's streams start, it is not text)."""
    if not sources:
        raise ParameterError("corpus.sources is empty: name at least one file, directory, glob or builtin:enwiki")
    files: list[Path] = []
    for source in sources:
        if source in BUILTIN:
            files.append(gensim_data(BUILTIN[source]))
        elif source.startswith("builtin:"):
            raise ParameterError(f"unknown built-in corpus {source!r}; choose from {', '.join(BUILTIN)}")
        elif os.path.isdir(source):
            found = sorted(p for p in Path(source).rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise InputError(f"{shown(source)}: directory holds no files")
            files.extend(found)
        elif os.path.isfile(source):  # before globs: an existing name may hold `[`, `*` or `?`
            files.append(Path(source))
        elif any(c in source for c in "*?["):
            found = sorted(_glob(source))
            if not found:
                raise InputError(f"{shown(source)}: no file matches this pattern")
            files.extend(found)
        else:
            raise InputError(f"{shown(source)}: no such file or directory; check the path in corpus.sources")
    files = list(dict.fromkeys(p.resolve() for p in files))
    indexes = {multistream_index(p) for p in files} - {None}
    return [p for p in files if p not in indexes]  # a dump's index tells where its streams start: not text


def _glob(pattern: str) -> list[Path]:
    """Files matching a glob pattern. `**` spans folders but, as for a folder source, never enters a
    link to a folder: `glob.glob` follows links, and two links to a parent folder make 2^depth paths
    (a search that never ends)."""
    if "**" not in pattern:
        return [Path(p) for p in glob.glob(pattern) if os.path.isfile(p)]
    parts = Path(pattern).parts
    first = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
    root = Path(*parts[:first]) if first else Path(".")
    return [p for p in root.glob(str(Path(*parts[first:])))  # pathlib's `**` skips links to folders
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)]


def fingerprint(files: list[Path], hash_limit: int = 1 << 30) -> list[dict]:
    """What the corpus version depends on: each file's SHA-256, or for files over `hash_limit`
    bytes its size and modification time (hashing 100 GB on every run costs more than it saves)."""
    out = []
    for path in files:
        stat = path.stat()
        entry = {"name": path.name, "size": stat.st_size}
        if stat.st_size > hash_limit:
            entry.update(mtime_ns=stat.st_mtime_ns, path=str(path))
        else:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            entry["sha256"] = digest.hexdigest()
        out.append(entry)
    return out


def format_of(path: Path) -> tuple[str, str | None]:
    name = path.name.lower()
    compression = next((c for c in ("gz", "bz2") if name.endswith("." + c)), None)
    if compression:
        name = name[: -len(compression) - 1]
    for suffix, fmt in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".parquet", "parquet"),
                        (".conllu", "conllu"), (".xml", "wiki")):
        if name.endswith(suffix):
            return fmt, compression
    return "text", compression


_MULTISTREAM_PART = re.compile(r"(.*multistream)(\d*)\.xml(-p\d+p\d+)?\.bz2")


def multistream_index(path: Path) -> Path | None:
    """Where a bz2 MediaWiki dump's multistream index would be (existing or not), by Wikipedia's naming:
    `X-multistream.xml.bz2` -> `X-multistream-index.txt.bz2`, `X-multistream1.xml-p1p41242.bz2` ->
    `X-multistream-index1.txt-p1p41242.bz2`, any other `X.xml.bz2` -> `X-index.txt.bz2`; None if not such a name."""
    if match := _MULTISTREAM_PART.fullmatch(path.name):
        return path.with_name(f"{match[1]}-index{match[2]}.txt{match[3] or ''}.bz2")
    if path.name.endswith(".xml.bz2"):
        return path.with_name(path.name[: -len(".xml.bz2")] + "-index.txt.bz2")
    return None


def file_split(path: Path) -> str | None:
    """The split the file's name gives (see the module's docstring), or None."""
    for part in path.name.lower().split("."):
        words = re.split(r"[-_]", part)
        # First or last word only: a split word between others is part of a description (`my_test_notes`)
        for word in (words[0], words[-1]):
            if word in _SPLIT_WORDS:
                return _SPLIT_WORDS[word]
    return None


def no_train_split(what: str, per_split: dict[str, int]) -> InputError:
    """The error for a corpus whose train split is empty (every later stage learns from it)."""
    held_out = ", ".join(f"{n} {split}" for split, n in sorted(per_split.items()) if n) or "none"
    return InputError(f"{what} has no train split (held out: {held_out}), and the tokenizer, embeddings, "
                      "LMs and taggers learn from it. A source file named after a split (wiki.valid.tokens, "
                      "en_ewt-ud-test.conllu) goes whole into that split: add training text, or give the file "
                      "a name without a split word so its documents are split by corpus.valid_fraction/test_fraction")


def tagged_files(files: list[Path]) -> list[Path]:
    return [p for p in files if format_of(p)[0] == "conllu"]
