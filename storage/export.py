"""`lexiflow artifacts export KIND[:VERSION] DIR`: an artifact's files in the open formats users
expect, in a plain folder, for tools that know nothing of lexiflow.

Every artifact file is already in an open format and is copied as is, with `manifest.json`:
Parquet tables (corpus, vocabulary, tokens, sparse matrices as row/col/value, vectors), word2vec
text `vectors.txt` and binary `vectors.bin` (embeddings), JSON configs, and safetensors + JSON
config for neural weights. Some kinds add a derived file (`EXTRAS`, kind → writer):
- tokenizer: `tokenizer.json`, a Hugging Face `tokenizers` WordLevel tokenizer with our vocabulary
  and pre-tokenization pattern (`tokenizers.Tokenizer.from_file` loads it).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lexiflow.storage.catalog import Catalog
from lexiflow.storage.store import MANIFEST, StoreError

Extra = Callable[[Catalog, dict[str, Any], Path], list[Path]]
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3 of every word-level vocabulary (models/vocab.py)


def hf_tokenizer_json(vocabulary: list[str], pattern: str, lowercase: bool, unk: str = "<unk>") -> dict[str, Any]:
    """A Hugging Face `tokenizer.json` (WordLevel model). The normalizer is ingestion's (controls
    removed, NFC, lowercase when the corpus was lowercased); pre-tokenization splits on whitespace,
    then isolates every match of our word pattern, which covers every non-space character, so
    it yields exactly our pre-tokenizer's tokens."""
    from lexiflow.models.text import hf_normalizer  # the text conventions' own spelling of themselves

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}
                         for i, token in enumerate(vocabulary) if token in SPECIALS],
        "normalizer": hf_normalizer(lowercase),
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        ]},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {token: i for i, token in enumerate(vocabulary)}, "unk_token": unk},
    }


def _tokenizer_extra(catalog: Catalog, manifest: dict[str, Any], dest: Path) -> list[Path]:
    store, kind, version = catalog.store, manifest["kind"], manifest["version"]
    config = store.read_json(kind, version, "config.json")
    if config.get("kind") != "word":
        return []  # subword tokenizers save their own tokenizer.json
    vocabulary = store.read_parquet(kind, version, "vocab.parquet").sort("id")["token"].to_list()
    path = dest / "tokenizer.json"
    path.write_text(json.dumps(hf_tokenizer_json(vocabulary, config["pattern"], catalog.lowercased(manifest)),
                               ensure_ascii=False))
    return [path]


EXTRAS: dict[str, Extra] = {
    "tokenizer": _tokenizer_extra,
}


def export(catalog: Catalog, kind: str, version: str | None, dest: str | Path) -> list[Path]:
    """Copy artifact `kind:version` (the latest when version is None) into folder `dest` (new, or
    empty), with the kind's extras; returns the paths written. The files go into a temporary folder
    beside `dest`, renamed to `dest` at the end: a failed export leaves nothing behind."""
    manifest = catalog.get(kind, version)
    kind, version = manifest["kind"], manifest["version"]
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise StoreError(f"export destination {dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()):  # never mix two exports, nor overwrite a manifest.json
        raise StoreError(f"export destination {dest} is not empty; choose a new or empty folder")
    target = dest.resolve()
    made = [p for p in target.parents if not p.exists()]  # folders to remove again if the export fails
    staging = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:  # a file in its path, no permission
        blocker = next(p for p in target.parents if p.exists())
        why = f"{blocker} is a file, not a folder" if not blocker.is_dir() else exc.strerror
        raise StoreError(f"export destination {dest}: cannot create it ({why}); choose another folder") from None
    try:
        store, names = catalog.store, [entry["name"] for entry in manifest["files"]] + [MANIFEST]
        for name in names:
            try:
                store.download(store.path(kind, version, name), staging / name)
            except FileNotFoundError:
                raise StoreError(f"{kind}:{version}/{name}: listed in the manifest but missing from the store "
                                 f"{store.url}; run `lexiflow artifacts verify`") from None
        extras = EXTRAS[kind](catalog, manifest, staging) if kind in EXTRAS else []
        os.rename(staging, target)  # replaces an empty folder; fails if one appeared meanwhile with files
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # deepest first; stop at one that is not empty (someone else's files)
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return [dest / name for name in names] + [dest / path.name for path in extras]
