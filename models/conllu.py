"""CoNLL-U reading and writing (https://universaldependencies.org/format.html).

Only what lexiflow needs: word forms, UPOS (column 4) and XPOS (column 5) per sentence.
Multi-word token lines (IDs like `3-4`) and empty nodes (`5.1`) are skipped; comment lines start
with `#`. Malformed lines, and lines that are not UTF-8, raise `InputError` naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lexiflow.models.errors import InputError, shown

TAG_COLUMNS = {"upos": 3, "xpos": 4}  # tag set -> its column index in a CoNLL-U token line


@dataclass
class Sentence:
    words: list[str] = field(default_factory=list)
    upos: list[str] = field(default_factory=list)
    xpos: list[str] = field(default_factory=list)
    sent_id: str = ""
    text: str = ""
    line: int = 0  # line number of the sentence's first line, for error messages


def parse_lines(lines: Iterable[str], source: str = "<conllu>") -> Iterator[Sentence]:
    """Yield sentences from CoNLL-U lines (with or without trailing newlines)."""
    sent = Sentence()
    expected_id = 1
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            if sent.words:
                yield sent
            sent, expected_id = Sentence(), 1
            continue
        if not sent.line:
            sent.line = line_no
        if line.startswith("#"):
            key, _, value = line[1:].partition("=")
            if key.strip() == "sent_id":
                sent.sent_id = value.strip()
            elif key.strip() == "text":
                sent.text = value.strip()
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise InputError(
                f"{source}:{line_no}: expected 10 tab-separated CoNLL-U columns, found {len(cols)}; "
                "fix the line or leave the file out"
            )
        token_id = cols[0]
        if "-" in token_id or "." in token_id:
            continue  # multi-word token or empty node: its words appear on their own lines
        if not (token_id.isascii() and token_id.isdigit()) or int(token_id) != expected_id:  # not '¹', '١'
            raise InputError(
                f"{source}:{line_no}: token ID {token_id!r} is not the expected integer {expected_id}; "
                "fix the line or leave the file out"
            )
        expected_id += 1
        sent.words.append(cols[1])
        sent.upos.append(cols[3])
        sent.xpos.append(cols[4])
    if sent.words:
        yield sent


def utf8_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 file, split at LF only (a leading byte-order mark is skipped, as ingestion
    does). Each line is decoded on its own, so one that is not UTF-8 raises `InputError` naming it."""
    offset = 0
    with Path(path).open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{shown(path)}:{line_no}: not UTF-8 text (byte {offset + exc.start}); "
                                 "save the file as UTF-8") from None
            offset += len(raw)
            yield line.removeprefix("\ufeff") if line_no == 1 else line


def read_conllu(path: str | Path) -> Iterator[Sentence]:
    """Sentences of a UTF-8 CoNLL-U file."""
    yield from parse_lines(utf8_lines(path), source=shown(path))


def format_sentence(sent: Sentence) -> str:
    """A minimal CoNLL-U block: ID, FORM, UPOS, XPOS filled, other columns `_`."""
    lines = []
    if sent.sent_id:
        lines.append(f"# sent_id = {sent.sent_id}")
    lines.append(f"# text = {sent.text or ' '.join(sent.words)}")
    for i, (w, u, x) in enumerate(zip(sent.words, sent.upos, sent.xpos, strict=True), start=1):
        lines.append(f"{i}\t{w}\t_\t{u}\t{x}\t_\t_\t_\t_\t_")
    return "\n".join(lines) + "\n\n"


def replace_tags(lines: Iterable[str], tags: dict[str, list[list[str]]]) -> Iterator[str]:
    """Re-emit CoNLL-U lines with predicted tags in the UPOS and/or XPOS column
    (`tags = {"upos": [...per sentence...], "xpos": [...]}`), everything else untouched but the
    tags of empty nodes (`5.1`), which no tagger predicts: `_` in the columns of `tags`."""
    sentence, position = 0, 0
    in_sentence = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        cols = line.split("\t")
        if len(cols) == 10 and cols[0].isdigit():
            in_sentence = True
            for name, predicted in tags.items():
                cols[TAG_COLUMNS[name]] = predicted[sentence][position]
            position += 1
            yield "\t".join(cols) + "\n"
            continue
        if len(cols) == 10 and "." in cols[0] and not line.startswith("#"):
            for name in tags:
                cols[TAG_COLUMNS[name]] = "_"
            yield "\t".join(cols) + "\n"
            continue
        if not line.strip() and in_sentence:
            sentence, position, in_sentence = sentence + 1, 0, False
        yield line + "\n"
