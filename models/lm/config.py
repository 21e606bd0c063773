"""The neural language models' configurations and their training loop's, apart from the models (as HF keeps
configuration_*.py apart from modeling_*.py): the pipeline derives its parameter sections from them without
importing torch (tasks/params.py)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Annotated, Literal

from lexiflow.models.config import check
from lexiflow.models.device import Device
from lexiflow.models.errors import ParameterError
from lexiflow.models.threads import DEFAULT_THREADS, Threads
from pydantic import Field

# The recurrent cells an RNNConfig names (models/lm/rnn.py maps them to torch's modules).
CELL_NAMES = ("rnn", "lstm", "gru")

# Pipeline parameters shared by several architectures (one description, one bound; models/config.py).
EmbDim = Annotated[int, Field(ge=4, le=4096, description="Embedding size (FFNN, RNNs).")]
HiddenDim = Annotated[int, Field(ge=4, le=8192, description="Hidden size (FFNN, RNNs); = emb_dim to tie weights.")]
TieWeights = Annotated[bool, Field(description="Output matrix = embedding matrix (RNNs need hidden = emb).")]


@dataclass
class LMConfig:
    """Fields every neural LM config shares: the vocabulary size and the special ids (keyword-only)."""

    vocab_size: int
    _: KW_ONLY
    unk_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    pad_id: int = 3
    dropout: Annotated[float, Field(ge=0, lt=1, description="Dropout.")] = 0.2
    freeze_embeddings: Annotated[bool, Field(description="Keep the (pretrained) embeddings fixed.")] = False

    def validate(self) -> None:
        check(self)
        if self.vocab_size < 4:
            raise ParameterError(f"vocab_size={self.vocab_size}: need at least the 4 special tokens")
        for name in ("unk_id", "bos_id", "eos_id", "pad_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ParameterError(f"{name}={getattr(self, name)} is outside [0, vocab_size={self.vocab_size})")


@dataclass
class FFNNConfig(LMConfig):
    vocab_size: int
    context_size: Annotated[int, Field(ge=1, le=16, description="FFNN: previous tokens seen (n - 1).")] = 4
    emb_dim: EmbDim = 128
    hidden_dim: HiddenDim = 128
    ffnn_activation: Annotated[Literal["tanh", "sigmoid"], Field(
        description="FFNN hidden activation: tanh (Bengio et al. 2003) or the notes' sigmoid, h = σ(W e).")] = "tanh"
    ffnn_bias: Annotated[bool, Field(description="FFNN: biases in the hidden and output layers (the notes' h = σ(W e), "
                                                 "z = U h have none).")] = True
    tie_weights: bool = False  # not offered: the output layer reads the hidden layer, not an embedding

    def validate(self) -> None:
        super().validate()
        if self.tie_weights:
            raise ParameterError("tie_weights=True is not available for the FFNN LM (its output layer reads the "
                                 "tanh hidden layer): use an RNN or Transformer LM to tie weights")


@dataclass
class RNNConfig(LMConfig):
    vocab_size: int
    cell: str = "lstm"  # "rnn" (Elman, tanh) | "lstm" | "gru"
    emb_dim: EmbDim = 128
    hidden_dim: HiddenDim = 128
    num_layers: Annotated[int, Field(ge=1, le=8, description="Stacked recurrent layers.")] = 2
    tie_weights: TieWeights = True

    def validate(self) -> None:
        super().validate()
        if self.cell not in CELL_NAMES:
            raise ParameterError(f"cell={self.cell!r}: use one of {sorted(CELL_NAMES)}")
        if self.tie_weights and self.hidden_dim != self.emb_dim:
            raise ParameterError(f"tie_weights=True needs hidden_dim == emb_dim (got {self.hidden_dim} and "
                                 f"{self.emb_dim}): make them equal or set tie_weights=False")


@dataclass
class TransformerConfig(LMConfig):
    vocab_size: int
    d_model: Annotated[int, Field(ge=8, le=8192, description="Transformer width.")] = 128
    n_layers: Annotated[int, Field(ge=1, le=48, description="Transformer blocks.")] = 2
    n_heads: Annotated[int, Field(ge=1, le=64, description="Transformer attention heads (divide d_model).")] = 4
    max_len: Annotated[int, Field(ge=8, le=8192, description="Transformer context window.")] = 128
    positional: Annotated[Literal["sinusoidal", "learned"], Field(description="Transformer positions.")] = "sinusoidal"
    norm: Annotated[Literal["pre", "post"], Field(
        description="Transformer LayerNorm placement: pre-LN x + f(LN(x)) with a final LN (GPT-2; trains stably) or "
                    "the notes' post-LN LayerNorm(x + f(x)) (Vaswani et al.).")] = "pre"
    ffn_activation: Annotated[Literal["gelu", "relu"], Field(
        description="Transformer feed-forward activation: GELU (GPT) or the notes' ReLU.")] = "gelu"
    tie_weights: TieWeights = True

    def validate(self) -> None:
        super().validate()
        if self.d_model % self.n_heads:
            raise ParameterError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


@dataclass
class TrainConfig:
    """Hyperparameters of the training loop (saved in the `lm` artifact's config.json). Annotated
    fields are pipeline parameters (models/config.py); their defaults are the pipeline's."""

    epochs: Annotated[int, Field(ge=1, le=1000, description="Training epochs.")] = 2
    # a cap on optimizer steps; also the schedule's length when smaller
    # 0 for "none" rather than None: the pipeline's form shows a plain number, not a type toggle
    max_steps: Annotated[int, Field(ge=0, description="Stop after this many optimizer steps (0: no cap).")] = 0
    batch_size: Annotated[int, Field(ge=1, le=4096, description="Parallel rows of the token stream.")] = 20
    # Transformer: at most its max_len
    bptt: Annotated[int, Field(ge=2, le=8192, description="Tokens per training window.")] = 35
    optimizer: Annotated[Literal["adamw", "sgd"], Field(description="Optimizer.")] = "adamw"
    lr: Annotated[float, Field(gt=0, le=100, description="Peak learning rate (warmup then cosine).")] = 2e-3
    weight_decay: float = 0.0
    momentum: float = 0.0  # SGD only
    beta1: float = 0.9
    beta2: float = 0.999
    warmup_steps: Annotated[int, Field(ge=0, description="Linear warmup steps.")] = 50
    schedule: str = "cosine"  # "cosine" | "constant"
    min_lr_ratio: float = 0.0  # cosine ends at lr * min_lr_ratio
    clip_grad_norm: float | None = 0.25
    device: Device = "auto"
    precision: str = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU) | "bf16" | "fp32"
    # Off by measurement: on the CPU 0.81-0.93x eager's speed a step after minutes of compiling (docs/neural_lm.md);
    # on CUDA `python -m benchmarks gpu` measures both, and its first run decides.
    compile: Annotated[bool, Field(description="torch.compile the module for training (minutes of compiling "
                                                "first; slower than eager on the CPU).")] = False
    max_nonfinite_steps: Annotated[int, Field(ge=1, le=100_000, description=(
        "Steps in a row with a non-finite loss or gradient (each skipped, nothing updated) before training "
        "stops with an error."))] = 20
    checkpoint_dir: str | None = None  # resume from here when a checkpoint exists
    patience: Annotated[int, Field(ge=0, description="Early stopping: epochs without validation gain (0: "
                                                     "off).")] = 0
    checkpoint_every: Annotated[int, Field(ge=0, description="Steps between checkpoints (0: epoch ends only).")] = 200
    eval_batch_size: int = 10
    seed: Annotated[int, Field(ge=0, description="Random seed.")] = 0
    threads: Threads = DEFAULT_THREADS
    log_every_s: float = 5.0
    sparse_grads: bool = True  # plain SGD in one process: the input embedding's gradient holds only the rows used

    def validate(self) -> None:
        check(self)
        checks = [
            ("schedule", self.schedule in ("cosine", "constant"), "use 'cosine' or 'constant'"),
            ("precision", self.precision in ("auto", "bf16", "fp32"), "use 'auto', 'bf16' or 'fp32'"),
            ("clip_grad_norm", self.clip_grad_norm is None or self.clip_grad_norm > 0, "use None or > 0"),
            ("eval_batch_size", self.eval_batch_size >= 1, "use 1 or more"),
            ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "use a fraction of lr in [0, 1]"),
        ]
        for name, ok, fix in checks:
            if not ok:
                raise ParameterError(f"TrainConfig.{name}={getattr(self, name)!r} is invalid: {fix}")
