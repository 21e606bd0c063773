"""The BERT-style encoder's configuration, apart from its torch model (models/encoder.py; as HF keeps
configuration_*.py apart from modeling_*.py): the pipeline derives its parameters without importing torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.errors import ParameterError
from pydantic import Field

if TYPE_CHECKING:
    from lexiflow.models.transformer_blocks import BlockConfig

# WordPiece special tokens at ids 0..4 (models/encoder.py: BERT_SPECIALS, [UNK] [CLS] [SEP] [PAD] [MASK]).
UNK_ID, CLS_ID, SEP_ID, PAD_ID, MASK_ID = range(5)


@dataclass
class EncoderConfig:
    """The encoder and its pretraining objective. Annotated fields are pipeline parameters."""

    vocab_size: int
    d_model: Annotated[int, Field(ge=8, le=4096, description="Encoder width.")] = 128
    n_layers: Annotated[int, Field(ge=1, le=48, description="Encoder layers.")] = 2
    n_heads: Annotated[int, Field(ge=1, le=64, description="Encoder attention heads (divide d_model).")] = 4
    d_ff: Annotated[int, Field(ge=8, le=16384, description="Encoder feed-forward width.")] = 512
    max_len: Annotated[int, Field(ge=8, le=4096, description="Encoder context (WordPiece tokens).")] = 128
    dropout: Annotated[float, Field(ge=0, lt=1, description="Encoder dropout.")] = 0.1
    norm: Annotated[Literal["pre", "post"], Field(description="LayerNorm placement (BERT: post).")] = "pre"
    mask_probability: Annotated[float, Field(gt=0, lt=1, description="MLM: share of tokens chosen.")] = 0.15
    nsp: Annotated[bool, Field(description="Also train next-sentence prediction (off: RoBERTa).")] = False
    # Chosen on held-out [MASK] loss (benchmarks/results/pretrain_sweep.md): torch's layer defaults let the
    # residual branches outweigh the N(0, 0.02) embeddings, and a frozen probe of the top layer lost word identity.
    init: Annotated[Literal["bert", "torch"], Field(description=(
        "Weight init: bert (N(0, 0.02) embeddings and linear layers, zero biases) or torch (each layer's "
        "default)."))] = "bert"
    specials: tuple[int, ...] = field(default=(UNK_ID, CLS_ID, SEP_ID, PAD_ID, MASK_ID))

    def validate(self) -> None:
        check(self)
        if self.d_model % self.n_heads:
            raise ParameterError(f"EncoderConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.vocab_size <= len(self.specials):
            raise ParameterError(f"EncoderConfig.vocab_size={self.vocab_size}: needs more than the "
                                 f"{len(self.specials)} special tokens")

    def blocks(self) -> BlockConfig:
        from lexiflow.models.transformer_blocks import BlockConfig  # here: it comes with torch

        return BlockConfig(self.d_model, self.n_heads, self.d_ff, self.dropout, self.norm, "gelu")
