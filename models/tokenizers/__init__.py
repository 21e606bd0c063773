"""Tokenizers: the word-level `Vocabulary` (models/vocab.py), BPE (Sennrich et al. 2016) and WordPiece
(Schuster & Nakajima 2012; Wu et al. 2016), with one interface, as Hugging Face `tokenizers` users
expect: `encode(text) -> ids`, `encode_batch(texts)`, `decode(ids)`, `tokenize(text) -> strings`,
`token_to_id`, `id_to_token`, `unk_id`/`bos_id`/`eos_id`/`pad_id`, `len(tokenizer)`.

`from lexiflow.models.tokenizers import BPE, WordPiece, load`; see docs/tokenizers.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from lexiflow.models.errors import InputError
from lexiflow.models.tokenizers.base import SubwordTokenizer
from lexiflow.models.tokenizers.bpe import BPE
from lexiflow.models.tokenizers.wordpiece import WordPiece
from lexiflow.models.vocab import Vocabulary

KINDS: dict[str, type[Vocabulary] | type[SubwordTokenizer]] = {"word": Vocabulary, "bpe": BPE,
                                                                "wordpiece": WordPiece}


def load(directory: str | Path) -> Vocabulary | SubwordTokenizer:
    """The `tokenizer` artifact in `directory`, by the `kind` its config.json names."""
    path = Path(directory) / "config.json"
    try:
        kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise InputError(f"{path}: cannot read the tokenizer config ({exc}); is {directory} a tokenizer?") from exc
    if kind not in KINDS:
        raise InputError(f"{path}: unknown tokenizer kind {kind!r}; known: {', '.join(KINDS)}")
    return KINDS[kind].load(directory)


__all__ = ["BPE", "KINDS", "SubwordTokenizer", "Vocabulary", "WordPiece", "load"]
