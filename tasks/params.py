"""Parameters of each stage as pydantic models: defaults, bounds and descriptions become the
Prefect UI form; unknown names are rejected (`extra="forbid"`) before any work starts."""

from __future__ import annotations

from typing import Annotated, Literal

from lexiflow.models.evaluation import DEFAULT_PROBES
from pydantic import BaseModel, ConfigDict, Field


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # inf passes ge= bounds


class CorpusParams(Params):
    sources: list[str] = Field(
        default=["builtin:enwiki"], min_length=1,
        description="Files, directories, glob patterns, or builtin:enwiki / builtin:lee. Formats: plain text "
                    "(.txt, any), .jsonl, .parquet, .conllu, MediaWiki .xml dumps; optionally .gz/.bz2.")
    lowercase: bool = Field(True, description="Lowercase the text after sentence splitting.")
    split_sentences: bool = Field(True, description="Split documents into sentences (one per line).")
    text_unit: Literal["line", "paragraph", "file"] = Field(
        "line", description="What one document is in plain-text files.")
    dedupe: bool = Field(True, description="Drop exact duplicate documents (after cleaning).")
    valid_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of documents in the valid split.")
    test_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of documents in the test split.")
    text_field: str = Field("text", min_length=1, description="JSONL field / Parquet column holding the text.")
    max_file_bytes: int = Field(4 << 30, ge=1, description="Largest decompressed file accepted, in bytes.")
    bad_files: Literal["fail", "skip"] = Field(
        "fail", description="A file that cannot be read (binary, bad encoding, malformed, truncated): stop with "
                            "its error, or skip it and list it in the corpus stats.")


class ParallelParams(Params):
    """How the sharded stages (ingestion, vocabulary, encoding, co-occurrence) run. It changes
    where the work happens, never the result: artifact versions do not depend on it."""

    runner: Literal["local", "threads", "processes", "dask"] = Field(
        "threads", description="Task runner for the shards: local (one after the other, in this process), threads "
                               "(a thread pool), processes (a process pool), dask (a Dask cluster).")
    workers: int = Field(2, ge=1, le=1024, description="Parallel shards (threads, processes, or workers of the "
                                                       "LocalCluster started when no dask_address is given).")
    dask_address: str | None = Field(
        None, pattern=r"^[a-z][a-z0-9+]*://\S+$",
        description="Scheduler of a running Dask cluster, e.g. tcp://10.0.0.5:8786 (workers need the sources and "
                    "the store at the same paths or URLs). None: a LocalCluster on this machine.")
    shard_bytes: int = Field(64 << 20, ge=1, le=1 << 40, description="Ingestion shard size: large plain-text and "
                             "JSONL files are cut into byte ranges of this size; smaller files are grouped up to it.")
    shard_rows: int = Field(500_000, ge=1, le=1 << 40, description="Vocabulary, encoding and co-occurrence shard "
                            "size in table rows (documents, or sentences for co-occurrence).")


class VocabularyParams(Params):
    min_count: int = Field(5, ge=1, description="Words seen fewer times in the train split become <unk>.")
    max_size: int | None = Field(None, ge=1, description="Keep at most this many words (most frequent first).")


class TokenizerParams(Params):
    kind: Literal["word", "bpe", "wordpiece"] = Field(
        "word", description="Tokens for the language models: the word vocabulary, or subwords learned by BPE "
                            "or WordPiece on the train split.")
    vocab_size: int = Field(8000, ge=16, le=1_000_000, description="Subword vocabulary size (specials included).")
    min_frequency: int = Field(2, ge=1, description="Subword training ignores pairs seen fewer times.")
    end_of_word: str = Field(
        "</w>", min_length=1, max_length=8, pattern=r"^[^\s\x1c-\x1f]+$",  # no space (str.isspace), as BPE checks
        description="BPE end-of-word marker (Sennrich et al.'s </w>). Pick one the word pre-tokenizer never puts "
                    "inside a word: with _ a word such as my_var decodes as 'my var'.")
    marker: Literal["glued", "separate"] = Field(
        "glued", description="BPE marker placement: glued to the last character (exportable to tokenizer.json) "
                             "or a separate symbol (as in textbook exercises).")


class CooccurrenceParams(Params):
    window: int = Field(5, ge=1, le=63, description="Words on each side counted as context.")
    weighting: Literal["uniform", "harmonic"] = Field(
        "harmonic", description="Weight of a pair at distance d: 1, or 1/d (harmonic, as GloVe).")
    subsample: float = Field(
        1e-4, ge=0, lt=1,
        description="word2vec's frequent-word subsampling before windowing: a word of frequency f > t is "
                    "kept with probability (√(f/t) + 1)·t/f (0 = off; 1e-4 tuned on dev pairs, docs/embeddings.md).")
    seed: int = Field(0, ge=0, description="Seed of the subsampling draws.")


class PPMIParams(Params):
    alpha: float = Field(0.75, gt=0, le=1, description="Context-distribution smoothing exponent (1 = none).")
    shift: float = Field(1.0, ge=1, description="Shift k: subtract log k (1 = plain PPMI).")


class SVDParams(Params):
    dim: int = Field(300, ge=2, le=2000, description="Embedding dimension.")
    power: float = Field(0.5, ge=0, le=1, description="Vectors are U·S^power.")
    add_context: bool = Field(False, description="Add the context vectors V·S^power.")
    n_iter: int = Field(5, ge=1, le=50, description="Power iterations of the randomized SVD.")
    seed: int = Field(0, ge=0, description="Random seed.")


class Word2VecParams(Params):
    dim: int = Field(100, ge=2, le=2000, description="Embedding dimension (skip-gram and CBOW).")
    window: int = Field(5, ge=1, le=50, description="Context words on each side.")
    negative: int = Field(5, ge=1, le=50, description="Noise words per positive pair (negative sampling).")
    sample: float = Field(1e-3, ge=0, le=1, description="Subsampling threshold of frequent words (0 = off).")
    epochs: int = Field(25, ge=1, le=200, description="Passes over the corpus (25 tuned on dev pairs for ~1M-token "
                                                       "corpora; gensim's 5 suits 100M+ tokens).")
    ns_exponent: float = Field(0.75, ge=0, le=1, description="Noise distribution ∝ count^exponent.")
    workers: int = Field(1, ge=1, le=64, description="gensim threads (1 is deterministic).")
    seed: int = Field(0, ge=0, description="Random seed.")


class GloVeParams(Params):
    dim: int = Field(100, ge=2, le=2000, description="Embedding dimension.")
    x_max: float = Field(0.5, gt=0, description="f(x) = min(1, (x/x_max)^alpha); tuned for ~1M-token corpora.")
    alpha: float = Field(0.75, gt=0, le=2, description="Exponent of the weighting f.")
    epochs: int = Field(20, ge=1, le=1000, description="Passes over the nonzero cells.")
    lr: float = Field(0.1, gt=0, le=10, description="AdaGrad (or Adam) step size.")
    batch_size: int = Field(65536, ge=1, description="Nonzero cells per step.")
    optimizer: Literal["adagrad", "adam"] = Field("adagrad", description="AdaGrad as in the original, or Adam.")
    adagrad_init: float = Field(1.0, gt=0, description="AdaGrad's initial accumulator G0 (glove.c with learning "
                                                       "rate eta = lr 1, adagrad_init 1/eta^2).")
    negative: int = Field(5, ge=0, le=100, description="Unobserved (zero) cells drawn per observed cell and held "
                                                       "below a fraction of the smallest count; 0 = the paper's "
                                                       "objective.")
    negative_weight: float = Field(1.0, gt=0, description="Weight of an unobserved cell's one-sided squared error.")
    negative_bound: float = Field(0.5, gt=0, le=1, description="Unobserved cells are held below this fraction of the "
                                                              "smallest count (0.5 tuned on dev pairs).")
    spectrum_power: float = Field(1.5, gt=0, le=10, description="The vectors' singular values raised to this power "
                                                               "(1 = as trained; > 1 favours similarity over "
                                                               "relatedness).")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present.")
    seed: int = Field(0, ge=0, description="Random seed.")


class EvaluationParams(Params):
    analogy_vocabulary: int = Field(30_000, ge=100, description="Analogy answers come from this many most "
                                                                "frequent words (as in word2vec's evaluation).")
    probes: list[str] = Field(default=list(DEFAULT_PROBES), description="Words whose nearest neighbours are shown.")
    projection_words: int = Field(300, ge=0, le=2000, description="Frequent words drawn in the PCA/t-SNE maps "
                                                                  "(0 = no maps).")


EmbeddingMethod = Literal["svd", "sgns", "cbow", "glove"]
EmbeddingMethods = Annotated[list[EmbeddingMethod], Field(min_length=1)]  # the UI form refuses an empty choice
LMKind = Literal["ngram", "ffnn", "rnn", "lstm", "gru", "transformer"]


class NgramParams(Params):
    order: int = Field(3, ge=1, le=8, description="n of the n-gram model.")
    smoothing: Literal["kneser_ney", "add_k", "mle"] = Field("kneser_ney", description="Estimator.")
    discount: float | None = Field(None, gt=0, le=1, description="Kneser–Ney discount; empty = modified KN "
                                                                  "(three discounts per order, estimated).")
    k: float = Field(1.0, gt=0, description="add-k smoothing constant.")
    min_count: int = Field(2, ge=1, description="Tokens seen fewer times in training count as <unk>, so <unk> "
                                                "has probability mass for unseen held-out tokens.")


class NeuralLMParams(Params):
    emb_dim: int = Field(128, ge=4, le=4096, description="Embedding size (FFNN, RNNs).")
    hidden_dim: int = Field(128, ge=4, le=8192, description="Hidden size (FFNN, RNNs); = emb_dim to tie weights.")
    num_layers: int = Field(2, ge=1, le=8, description="Stacked recurrent layers.")
    context_size: int = Field(4, ge=1, le=16, description="FFNN: previous tokens seen (n - 1).")
    d_model: int = Field(128, ge=8, le=8192, description="Transformer width.")
    n_layers: int = Field(2, ge=1, le=48, description="Transformer blocks.")
    n_heads: int = Field(4, ge=1, le=64, description="Transformer attention heads (divide d_model).")
    max_len: int = Field(128, ge=8, le=8192, description="Transformer context window.")
    positional: Literal["sinusoidal", "learned"] = Field("sinusoidal", description="Transformer positions.")
    dropout: float = Field(0.2, ge=0, lt=1, description="Dropout.")
    tie_weights: bool = Field(True, description="Output matrix = embedding matrix (RNNs need hidden = emb).")
    pretrained: Literal["none", "svd", "sgns", "cbow", "glove"] = Field(
        "none", description="Initialise the neural LMs' embeddings from this method's embeddings artifact of the same "
                            "run: the method must be among `embeddings`, its dim equal to emb_dim (d_model for the "
                            "transformer). Ignored when lm holds no neural model.")
    freeze_embeddings: bool = Field(False, description="Keep the (pretrained) embeddings fixed.")
    epochs: int = Field(2, ge=1, le=1000, description="Training epochs.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    batch_size: int = Field(20, ge=1, le=4096, description="Parallel rows of the token stream.")
    bptt: int = Field(35, ge=2, le=8192, description="Tokens per training window.")
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="Optimizer.")
    lr: float = Field(2e-3, gt=0, le=100, description="Peak learning rate (warmup then cosine).")
    warmup_steps: int = Field(50, ge=0, description="Linear warmup steps.")
    patience: int | None = Field(None, ge=1, description="Early stopping: epochs without validation gain.")
    checkpoint_every: int = Field(200, ge=0, description="Steps between checkpoints (0: epoch ends only).")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present.")
    seed: int = Field(0, ge=0, description="Random seed.")
    world_size: int = Field(1, ge=1, le=64, description="Data-parallel processes (DDP, one per GPU) the stage launches "
                                                        "with torchrun; batch_size is the global batch. 1: train in "
                                                        "the stage's own process.")


TaggerKind = Literal["hmm", "bilstm", "bilstm+elmo"]


class TaggerParams(Params):
    columns: list[Literal["upos", "xpos"]] = Field(
        default=["upos", "xpos"], description="Tag sets to learn from CoNLL-U sources, a tagger artifact each.")
    kinds: list[TaggerKind] = Field(
        default=["hmm"], min_length=1,
        description="Taggers to train per tag set, compared side by side in the report: hmm (trigram HMM), bilstm "
                    "(BiLSTM with a char CNN), bilstm+elmo (BiLSTM with the `elmo` stage's biLM layers as features).")
    order: Literal[2, 3] = Field(3, description="HMM order: 2 (bigram transitions) or 3 (trigram, TnT-style).")
    method: Literal["viterbi", "greedy", "beam"] = Field("viterbi", description="Decoding for evaluation.")
    beam_width: int = Field(8, ge=1, le=1024, description="Beam width for method=beam.")
    refine_states: bool = Field(True, description="Split each tag's HMM states by the other tag set during "
                                                  "training (UPOS by XPOS and vice versa); tagging returns plain "
                                                  "tags.")
    hidden_dim: int = Field(150, ge=4, le=4096, description="BiLSTM: LSTM size per direction.")
    num_layers: int = Field(2, ge=1, le=8, description="BiLSTM: stacked bidirectional layers.")
    epochs: int = Field(10, ge=1, le=1000, description="BiLSTM: training epochs (early stopping on dev accuracy).")
    batch_size: int = Field(32, ge=1, le=4096, description="BiLSTM: sentences per batch.")
    lr: float = Field(2e-3, gt=0, le=10, description="BiLSTM: peak AdamW learning rate (warmup then cosine).")
    patience: int | None = Field(3, ge=1, description="BiLSTM: epochs without a dev gain before stopping.")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="BiLSTM: auto picks CUDA when present.")
    seed: int = Field(0, ge=0, description="BiLSTM: random seed.")


class ElmoParams(Params):
    """The biLM the `bilstm+elmo` tagger reads (trained by the `elmo` stage on the corpus sources)."""

    token_input: Literal["char", "word"] = Field("char", description="Token representation: char CNN (as ELMo) "
                                                                     "or a word embedding.")
    dim: int = Field(64, ge=4, le=4096, description="Width of each direction's layers (the token vector too).")
    hidden_dim: int = Field(160, ge=4, le=8192, description="LSTM cell size (projected to dim).")
    num_layers: int = Field(2, ge=1, le=8, description="LSTM layers per direction.")
    max_vocab: int = Field(5000, ge=10, description="Softmax vocabulary: the most frequent words.")
    epochs: int = Field(1, ge=1, le=1000, description="Training epochs.")
    batch_size: int = Field(32, ge=1, le=4096, description="Sentences per batch.")
    lr: float = Field(2e-3, gt=0, le=10, description="Peak AdamW learning rate.")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto picks CUDA when present.")
    seed: int = Field(0, ge=0, description="Random seed.")
