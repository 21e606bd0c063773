"""The translation models' configurations and their tokens', apart from the torch models (rnn.py,
transformer.py, translator.py): the pipeline derives its parameters without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.errors import ParameterError
from lexiflow.models.seq2seq import Dropout
from pydantic import Field

if TYPE_CHECKING:
    from lexiflow.models.transformer_blocks import BlockConfig


@dataclass
class RNNSeq2SeqConfig:
    """Annotated fields are pipeline parameters (the `seq2seq` section, models/config.py)."""

    src_vocab_size: int = 0  # set from the tokenizers by Translator.fit
    tgt_vocab_size: int = 0
    cell: Annotated[Literal["gru", "lstm"], Field(description="RNN cell.")] = "gru"
    emb_dim: Annotated[int, Field(ge=4, le=4096, description="RNN embedding size.")] = 256
    hidden_dim: Annotated[int, Field(ge=4, le=8192, description="RNN hidden size.")] = 256
    num_layers: Annotated[int, Field(ge=1, le=8, description="Stacked RNN layers (encoder and decoder).")] = 1
    bidirectional: Annotated[bool, Field(description="Bidirectional RNN encoder.")] = False
    attention: Annotated[Literal["none", "dot", "general", "additive"], Field(
        description="RNN attention score: none (c = the final encoder state at every step), dot, general "
                    "(bilinear) or additive (MLP, Bahdanau).")] = "additive"
    dropout: Dropout = 0.2
    pad_id: int = 3

    def validate(self) -> None:
        check(self)
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if getattr(self, name) < 1:
                raise ParameterError(f"{name}={getattr(self, name)}: use 1 or more")


@dataclass
class TransformerSeq2SeqConfig:
    """Annotated fields are pipeline parameters (the `seq2seq` section, models/config.py)."""

    src_vocab_size: int = 0  # set from the tokenizers by Translator.fit
    tgt_vocab_size: int = 0
    d_model: Annotated[int, Field(ge=8, le=8192, description="Transformer width.")] = 256
    n_heads: Annotated[int, Field(ge=1, le=64, description="Transformer attention heads (divide d_model).")] = 4
    d_ff: Annotated[int, Field(ge=8, le=32768, description="Transformer feed-forward size.")] = 512
    encoder_layers: Annotated[int, Field(ge=1, le=48, description="Transformer encoder layers.")] = 2
    decoder_layers: Annotated[int, Field(ge=1, le=48, description="Transformer decoder layers.")] = 2
    dropout: Dropout = 0.2
    norm: Annotated[Literal["post", "pre"], Field(
        description="Transformer LayerNorm(x + Sublayer(x)) (post, the paper's and the notes') or "
                    "x + Sublayer(LayerNorm(x)) (pre).")] = "pre"
    activation: Annotated[Literal["relu", "gelu"], Field(description="Transformer FFN activation.")] = "relu"
    positional: Annotated[Literal["sinusoidal", "learned"], Field(description="Transformer positions.")] = \
        "sinusoidal"
    max_len: Annotated[int, Field(ge=8, le=8192, description="Transformer: longest source or target in "
                                                              "tokens.")] = 256
    tie_embeddings: Annotated[bool, Field(description="Transformer: the target embedding is the output "
                                                      "matrix.")] = True
    pad_id: int = 3

    def block(self) -> BlockConfig:
        from lexiflow.models.transformer_blocks import BlockConfig  # here: it comes with torch

        return BlockConfig(self.d_model, self.n_heads, self.d_ff, self.dropout, self.norm, self.activation)

    def validate(self) -> None:
        check(self)
        self.block().validate()
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if getattr(self, name) < 1:
                raise ParameterError(f"{name}={getattr(self, name)}: use 1 or more")


@dataclass
class TokenizerConfig:
    """Source and target tokens. Annotated fields are pipeline parameters (models/config.py)."""

    tokenizer: Annotated[Literal["word", "bpe", "wordpiece"], Field(
        description="Source and target tokens: words (rarer ones <unk>), BPE or WordPiece subwords.")] = "word"
    vocab_size: Annotated[int, Field(ge=16, le=1_000_000, description="Vocabulary per side (or joint), specials "
                                                                      "included.")] = 8000
    joint_vocabulary: Annotated[bool, Field(description="One tokenizer learned on both sides.")] = False
    min_count: Annotated[int, Field(ge=1, description="Rarer words become <unk> (word); subword training's "
                                                      "minimum pair frequency.")] = 1

    def validate(self) -> None:
        check(self)
