"""docs/artifacts.md's table of files and columns against real artifacts of every kind."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.artifact_zoo import build

DOC = Path(__file__).resolve().parents[1] / "docs" / "artifacts.md"
ROW = re.compile(r"^\| `(\w+)`(?: \((\w+)\))? \| (.+?) \| (.+) \|$")


def documented() -> dict[tuple[str, str], dict[str, str]]:
    """(kind, qualifier) -> {file name pattern: columns as documented}."""
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("| artifact | file | columns |"):]
    table = table[:table.index("\n\n")]
    files: dict[tuple[str, str], dict[str, str]] = {}
    for line in table.splitlines()[2:]:
        kind, qualifier, names, columns = ROW.match(line).groups()
        for name in re.findall(r"`([^`]+)`", names):
            files.setdefault((kind, qualifier or ""), {})[name] = columns.strip("`")
    return files


def qualifier(manifest: dict) -> str:
    """Which documented variant of its kind an artifact is."""
    metrics = manifest["metrics"]
    return {"tokenizer": lambda: "word" if metrics["kind"] == "word" else "subword",
            "embeddings": lambda: "svd" if metrics["method"] == "svd" else "trained",
            "lm": lambda: "ngram" if metrics["model"] == "ngram" else "neural"}.get(manifest["kind"], lambda: "")()


def pattern(name: str) -> re.Pattern:
    return re.compile(re.sub(r"<\w+>", r"\\w+", re.escape(name).replace(r"\<", "<").replace(r"\>", ">")) + "$")


@pytest.mark.slow
def test_docs_name_every_file_and_its_column_types(tmp_path):
    store = build(tmp_path)
    docs = documented()
    checked = set()
    for kind in sorted({p.parent.parent.name for p in Path(store.root).glob("*/*/manifest.json")}):
        for folder in Path(store.root, kind).iterdir():
            manifest = store.manifest(kind, folder.name)
            variant = (kind, qualifier(manifest))
            assert variant in docs, f"docs/artifacts.md has no row for {variant}"
            names = [entry["name"] for entry in manifest["files"]]
            for name in names:
                match = [doc for doc in docs[variant] if pattern(doc).match(name)]
                assert match, f"{kind} {variant[1]}: {name} is not in docs/artifacts.md"
                columns = docs[variant][match[0]]
                checked.add((*variant, match[0]))
                if name.endswith(".parquet") and not columns.startswith("w1"):
                    schema = pq.read_schema(folder / name)
                    real = ", ".join(f"{f.name}: {f.type}" for f in schema)
                    assert re.sub(r"\[\d+\]", "[dim]", real) == columns, f"{kind}/{name}"
            for doc in docs[variant]:  # nothing documented that this kind does not write
                assert any(pattern(doc).match(name) for name in names) or kind == "report", f"{variant} {doc}"
    assert {(k, q) for k, q, _ in checked} == set(docs)  # every documented variant was seen
