"""The language-model kinds, and one `load` for any `lm` artifact folder.

`KINDS` maps a model name (the pipeline's `lm.model`, and the `kind` a neural artifact's config.json
records) to its estimator class; a new kind is one line here. `load(directory)` reads the folder's
config.json and hands it to that class's own `load`. Nothing registers itself on import.
"""

from __future__ import annotations

import json
from pathlib import Path

from lexiflow.models.errors import InputError
from lexiflow.models.lm.ffnn import FFNNLM
from lexiflow.models.lm.neural import NeuralLM
from lexiflow.models.lm.ngram import FORMAT as NGRAM_FORMAT
from lexiflow.models.lm.ngram import NgramLM
from lexiflow.models.lm.rnn import RNNLM
from lexiflow.models.lm.transformer import TransformerLM

KINDS: dict[str, type[NgramLM] | type[NeuralLM]] = {
    "ngram": NgramLM,
    "ffnn": FFNNLM,
    "rnn": RNNLM,
    "lstm": RNNLM,  # an RNNLM with cell="lstm" (saved as kind "rnn")
    "gru": RNNLM,  # cell="gru"
    "transformer": TransformerLM,
}


def neural_class(kind: str, where: str | Path) -> type[NeuralLM]:
    """The neural estimator class of `kind`, or an error naming `where` the kind came from."""
    cls = KINDS.get(kind)
    if cls is None or not issubclass(cls, NeuralLM):
        neural = sorted(k for k, c in KINDS.items() if issubclass(c, NeuralLM))
        raise InputError(f"{where}: unknown neural LM kind {kind!r}; known: {', '.join(neural)}")
    return cls


def kind_of(directory: str | Path) -> str:
    """The kind of the `lm` artifact in `directory`: "ngram", or the neural config's `kind`."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read it ({e}); is {directory} an lm artifact?") from e
    if config.get("format") == NGRAM_FORMAT:
        return "ngram"
    if not isinstance(config.get("kind"), str):
        raise InputError(f"{path}: names no LM kind (neither an n-gram format nor a neural `kind`)")
    return config["kind"]


def load(directory: str | Path, device: str = "cpu") -> NgramLM | NeuralLM:
    """Any `lm` artifact folder as its estimator (neural weights on `device`)."""
    kind = kind_of(directory)
    if kind == "ngram":
        return NgramLM.load(directory)
    return neural_class(kind, Path(directory) / "config.json").load(directory, device)
