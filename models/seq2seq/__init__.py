"""Sequence to sequence: RNN and Transformer encoder–decoders, greedy/beam decoding, the Translator estimator."""

from typing import Annotated

from pydantic import Field

# Declared once for both encoder–decoders: they share one pipeline section (models/config.py).
Dropout = Annotated[float, Field(ge=0, lt=1, description="Dropout (embeddings, between layers, before the output).")]
