"""Parameters of each stage as pydantic models: defaults, bounds and descriptions become the
Prefect UI form; unknown names are rejected (`extra="forbid"`) before any work starts.

A model's parameters are declared once, where the model is (models/config.py: annotated config
fields or estimator parameters); their sections here are derived with `section`. The sections
written out below hold what belongs to the pipeline itself (sources, sharding, evaluation sets).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from lexiflow.models import checks, lsi, ppmi, svd
from lexiflow.models.config import parameters
from lexiflow.models.encoder_config import EncoderConfig
from lexiflow.models.evaluation import DEFAULT_PROBES
from lexiflow.models.extrinsic_config import ClassifierConfig
from lexiflow.models.finetune_config import LR_GRID, FineTuneConfig
from lexiflow.models.glove_config import GloVeConfig
from lexiflow.models.ingest import IngestOptions
from lexiflow.models.lm.config import FFNNConfig, RNNConfig, TrainConfig, TransformerConfig
from lexiflow.models.lm.ngram import NgramLM
from lexiflow.models.neural_tagger_config import TaggerConfig
from lexiflow.models.seq2seq.config import RNNSeq2SeqConfig, TokenizerConfig, TransformerSeq2SeqConfig
from lexiflow.models.threads import DEFAULT_THREADS, Threads
from lexiflow.models.tokenizers import BPE, WordPiece
from lexiflow.models.vocab import Vocabulary
from lexiflow.models.word2vec_config import Word2VecConfig
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

# The form's labels: a field's name in words (`min_count`: "Min count"), these words spelled out or capitalised.
WORDS = {"lr": "learning rate", "dim": "dimensions", "emb": "embedding", "vocab": "vocabulary", "lm": "LM",
         "ffnn": "FFNN", "ffn": "FFN", "hmm": "HMM", "bptt": "BPTT", "nsp": "NSP", "lora": "LoRA", "mlm": "MLM",
         "seq2seq": "seq2seq", "pppl": "pseudo-perplexity", "ws353": "WS-353", "z": "z", "x": "x", "k": "k",
         "num": "number of", "n": "number of", "eval": "evaluation", "d": "width:", "ff": "feed-forward",
         "upos": "UPOS", "xpos": "XPOS", "bleu": "BLEU", "dask": "Dask", "elmo": "ELMo", "ns": "negative sampling",
         "svd": "SVD", "lsi": "LSI", "ppmi": "PPMI", "glove": "GloVe", "ngram": "n-gram",
         "cooccurrence": "co-occurrence",
         "finetune": "fine-tuning", "pretrain": "pretraining", "finetuned": "fine-tuned", "neural": "neural LMs"}
# Names whose words read badly (`d_model`: "Width: model").
TITLES = {"d_model": "Model width (d_model)", "d_ff": "Feed-forward width (d_ff)", "n_iter": "Iterations",
          "x_max": "x_max (GloVe weighting cap)", "k": "k", "bptt": "BPTT length", "when": "Release when",
          "alias": "Alias", "store": "Artifact store", "lm": "Language models", "nsp": "Next-sentence prediction",
          "lrs": "Learning rates tried", "init": "Weight init"}


def title(name: str, *_: Any) -> str:
    """A field's label in the UI form, derived from its name once for every section (pydantic's
    `field_title_generator`; its default would read "N Iter", "Lm Deployment")."""
    if name in TITLES:
        return TITLES[name]
    text = " ".join(WORDS.get(word, word) for word in name.split("_"))
    return text[:1].upper() + text[1:]


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,  # inf passes ge= bounds
                              field_title_generator=title)


def section(name: str, *sources: Any, doc: str | None = None, base: type[Params] = Params,
            defaults: dict[str, Any] | None = None, first: tuple[str, ...] = (),
            **own: tuple[Any, Any]) -> type[Params]:
    """A pipeline section derived from models' declared parameters (config dataclasses, estimators,
    functions: models/config.py), plus `own` fields (name=(type, default)) of the pipeline's and those
    of a `base` section. A name
    declared by several sources must be declared alike (type, bounds, description, default); `defaults`
    gives this section's own default for a derived field (type and bounds stay as declared); `first` names own
    fields the form shows before the derived ones (what a run changes most: the sources, the models)."""
    fields: dict[str, tuple[Any, Any]] = {}
    for source in sources:
        for field, declared in parameters(source).items():
            if field in fields and repr(fields[field]) != repr(declared):
                raise TypeError(f"{name}.{field}: {getattr(source, '__qualname__', source)} declares it as "
                                f"{declared}, an earlier source as {fields[field]}: declare it once")
            fields[field] = declared
    for field, value in (defaults or {}).items():
        fields[field] = (fields[field][0], value)
    ordered = {**{field: own[field] for field in first}, **fields, **own}  # the form's order; versions sort keys
    return create_model(name, __base__=base, __doc__=doc or base.__doc__, __module__=__name__, **ordered)


TRAINING = ("epochs", "max_steps", "batch_size", "lr", "warmup_steps", "patience", "checkpoint_every", "device", "seed",
            "threads")


def training(batch: str, names: tuple[str, ...] = TRAINING, **defaults: Any) -> dict[str, tuple[Any, Any]]:
    """The training loop's parameters `names`, as TrainConfig declares them, with a stage's own
    defaults and batch unit (what one row of a batch is)."""
    declared = parameters(TrainConfig)
    fields = {name: (declared[name][0], defaults.get(name, declared[name][1])) for name in names}
    kind, *metadata = get_args(declared["batch_size"][0])
    info = FieldInfo.merge_field_infos(*(m for m in metadata if isinstance(m, FieldInfo)),
                                       description=f"{batch} per batch.")
    fields["batch_size"] = (Annotated[kind, info], fields["batch_size"][1])
    return fields


CorpusParams = section(
    "CorpusParams", IngestOptions, first=("sources",),
    threads=(Threads, DEFAULT_THREADS),
    sources=(list[str], Field(
        default=["builtin:enwiki"], min_length=1,
        description="Files, directories, glob patterns, or builtin:enwiki / builtin:lee. Formats: plain text "
                    "(.txt, any), .jsonl, .parquet, .conllu, MediaWiki .xml dumps; optionally .gz/.bz2.")))

# Co-occurrence shards: ~12 M tokens of ~24-token sentences, ~1.9 GB on a worker (docs/scaling.md; against
# 250 000, half the task runs and merges, 1.43x on 2 workers either way). Sentences are short and alike, so
# rows measure the work; documents are not (a few words to a book).
COOCCURRENCE_SHARD_SENTENCES = 500_000


class ParallelParams(Params):
    """How the sharded stages (ingestion, vocabulary, encoding, co-occurrence) run. It changes
    where the work happens, never the result: artifact versions do not depend on it."""

    runner: Literal["local", "threads", "processes", "dask"] = Field(
        "threads", description="Task runner for the shards: local (one after the other, in this process), threads "
                               "(a thread pool), processes (a process pool), dask (a Dask cluster).")
    workers: int = Field(2, ge=1, le=1024, description="Parallel shards (threads, processes, or workers of the "
                                                       "LocalCluster started when no dask_address is given).")
    dask_address: str = Field(
        "", pattern=r"^([a-z][a-z0-9+]*://\S+)?$",
        description="Scheduler of a running Dask cluster, e.g. tcp://10.0.0.5:8786 (workers need the sources and "
                    "the store at the same paths or URLs). Empty: a LocalCluster on this machine.")
    shard_bytes: int = Field(64 << 20, ge=1, le=1 << 40, description="Shard size: large plain-text and JSONL "
                             "files are cut into byte ranges of this size (smaller files are grouped up to it), and "
                             "vocabulary and encoding shards hold this much of the documents table.")
    shard_rows: int = Field(0, ge=0, le=1 << 40, description="Shard size in table rows, at most (documents; "
                            "sentences for co-occurrence), overriding the defaults (0): documents by `shard_bytes`, "
                            f"{COOCCURRENCE_SHARD_SENTENCES:,} sentences per co-occurrence shard.")
    # Off by default: pieces multiply a corpus build's writes, and on flaky storage its retries ran out
    # (tests/test_reliability.py); co-occurrence (and so PPMI) counts do not reuse pieces (docs/design.md).
    pieces: bool = Field(False, description="Keep what each piece of the sources gave (its cleaned documents; per "
                         "run of documents its word counts, encoding and n-gram counts) in the store, under .pieces/, "
                         "and reuse it when a later corpus holds the same piece: a rebuild after a change costs the "
                         "changed pieces, and gives "
                         "the artifacts a full build gives. Off: no piece is read or written.")


VocabularyParams = section("VocabularyParams", Vocabulary.from_counts)


TokenizerParams = section(
    "TokenizerParams", BPE, WordPiece,
    kind=(Literal["word", "bpe", "wordpiece"], Field(
        "word", description="Tokens for the language models: the word vocabulary, or subwords learned by BPE "
                            "or WordPiece on the train split.")))


class CooccurrenceParams(Params):
    window: int = Field(5, ge=1, le=63, description="Words on each side counted as context.")
    weighting: Literal["uniform", "harmonic"] = Field(
        "harmonic", description="Weight of a pair at distance d: 1, or 1/d (harmonic, as GloVe).")
    subsample: float = Field(
        1e-4, ge=0, lt=1,
        description="word2vec's frequent-word subsampling before windowing: a word of frequency f > t is "
                    "kept with probability (√(f/t) + 1)·t/f (0 = off; 1e-4 tuned on dev pairs, docs/embeddings.md).")
    seed: int = Field(0, ge=0, description="Seed of the subsampling draws.")


PPMIParams = section(
    "PPMIParams", ppmi.ppmi_matrix,
    counts=(Literal["window", "termdoc"], Field(
        "window", description="Word-context counts PPMI weighs: the co-occurrence window's, or the term-term matrix "
                              "X·Xᵀ of the term-document matrix X (the notes' review question; denser, so for small "
                              "corpora).")))
SVDParams = section(
    "SVDParams", svd.svd_vectors,
    warm_start=(bool, Field(False, description="Start the randomized SVD from the basis of the newest SVD embeddings "
                                               "of the same parameters built from another PPMI matrix in the store (a "
                                               "rebuild of a grown corpus: fewer power iterations); the artifact's "
                                               "version and manifest name the embeddings it started from.")))
LSIParams = section("LSIParams", svd.svd_vectors, lsi.weigh)
# Trained embeddings start from random unless asked: a continued model is not the one a cold build makes
CONTINUE_FROM = (str, Field("", description="Continue training from these embeddings of the same method and "
                                            "dimensions: a version, or a release alias such as production-sgns "
                                            "(a rebuild of a grown corpus); empty = from random. The artifact's "
                                            "version and manifest name the version it continued."))
Word2VecParams = section("Word2VecParams", Word2VecConfig, continue_from=CONTINUE_FROM)
GloVeParams = section("GloVeParams", GloVeConfig, continue_from=CONTINUE_FROM)


EvaluationParams = section(
    "EvaluationParams", ClassifierConfig,
    threads=(Threads, DEFAULT_THREADS),
    analogy_vocabulary=(int, Field(30_000, ge=100, description="Analogy answers come from this many most frequent "
                                                               "words (as in word2vec's evaluation).")),
    probes=(list[str], Field(default=list(DEFAULT_PROBES), description="Words whose nearest neighbours are shown.")),
    projection_words=(int, Field(300, ge=0, le=2000, description="Frequent words drawn in the PCA/t-SNE maps (0 = "
                                                                 "no maps).")),
    genre_treebank=(str, Field("", description="Extrinsic evaluation: folder of a UD treebank "
                                      "(*-ud-train/dev/test.conllu, e.g. UD English-EWT) whose sentence genre (the "
                                      "sent_id prefix) a feed-forward classifier learns from averaged word vectors; "
                                      "empty = off.")))


EmbeddingMethod = Literal["svd", "lsi", "sgns", "cbow", "glove"]
EmbeddingMethods = Annotated[list[EmbeddingMethod], Field(min_length=1)]  # the UI form refuses an empty choice
LMKind = Literal["ngram", "ffnn", "rnn", "lstm", "gru", "transformer"]


# Embeddings of the same run that initialise a neural model's word embeddings (none: random).
PretrainedVectors = Literal["none", "svd", "lsi", "sgns", "cbow", "glove"]

NgramParams = section("NgramParams", NgramLM)
NeuralLMParams = section(
    "NeuralLMParams", RNNConfig, FFNNConfig, TransformerConfig, TrainConfig,
    pretrained=(PretrainedVectors, Field(
        "none", description="Initialise the neural LMs' embeddings from this method's embeddings artifact of the same "
                            "run: the method must be among `embeddings`, its dim equal to emb_dim (d_model for the "
                            "transformer). Ignored when lm holds no neural model.")),
    world_size=(int, Field(1, ge=1, le=64, description="Data-parallel processes (DDP, one per GPU) the stage launches "
                                                       "with torchrun; batch_size is the global batch. 1: train in "
                                                       "the stage's own process.")))


TaggerKind = Literal["hmm", "bilstm", "bilstm+elmo"]


class TaggerSettings(Params):
    """Taggers trained on the tagged corpus (CoNLL-U sources)."""

    columns: list[Literal["upos", "xpos"]] = Field(
        default=["upos", "xpos"], description="Tag sets to learn from CoNLL-U sources, a tagger artifact each.")
    kinds: list[TaggerKind] = Field(
        default=["hmm"], min_length=1,
        description="Taggers to train per tag set, compared side by side in the report: hmm (trigram HMM), bilstm "
                    "(BiLSTM with a char CNN), bilstm+elmo (BiLSTM with the `elmo` stage's biLM layers as features).")
    order: Literal[2, 3] = Field(3, description="HMM order: 2 (bigram transitions) or 3 (trigram, TnT-style).")
    method: Literal["viterbi", "viterbi_pruned", "greedy", "beam"] = Field(
        "viterbi", description="Decoding for evaluation: exact Viterbi, Viterbi over each word's best tags "
                               "(~35x faster on EWT, 0.1 points less accurate), greedy or beam search.")
    beam_width: int = Field(8, ge=1, le=1024, description="Beam width for method=beam.")
    refine_states: bool = Field(True, description="Split each tag's HMM states by the other tag set during "
                                                  "training (UPOS by XPOS and vice versa); tagging returns plain "
                                                  "tags.")
    pretrained: PretrainedVectors = Field(
        "none", description="Initialise the BiLSTM taggers' word embeddings from this method's embeddings artifact of "
                            "the same run (it must be among `embeddings`; its width becomes the word embeddings' "
                            "width, and words of the vectors unseen in the treebank keep their vector). The HMM reads "
                            "none.")


# The BiLSTM's model (TaggerConfig) and training loop (early stopping on dev accuracy); the HMM reads none.
TaggerParams = section("TaggerParams", TaggerConfig, base=TaggerSettings, **training(
    "Sentences", names=("epochs", "batch_size", "lr", "patience", "device", "seed", "threads"), epochs=10,
    batch_size=32, lr=2e-3, patience=3))


class ElmoSettings(Params):
    """The biLM the `bilstm+elmo` tagger reads (trained by the `elmo` stage on the corpus sources)."""

    token_input: Literal["char", "word"] = Field("char", description="Token representation: char CNN (as ELMo) "
                                                                     "or a word embedding.")
    dim: int = Field(64, ge=4, le=4096, description="Width of each direction's layers (the token vector too).")
    hidden_dim: int = Field(160, ge=4, le=8192, description="LSTM cell size (projected to dim).")
    num_layers: int = Field(2, ge=1, le=8, description="LSTM layers per direction.")
    max_vocab: int = Field(5000, ge=10, description="Softmax vocabulary: the most frequent words.")


ElmoParams = section("ElmoParams", base=ElmoSettings, **training(
    "Sentences", names=("epochs", "batch_size", "lr", "device", "seed", "threads"), epochs=1, batch_size=32, lr=2e-3))


class TranslationCorpusParams(Params):
    sources: list[str] = Field(
        default=[], description="Parallel sources for the translation stages (empty: none run): .tsv files "
                                "(source<TAB>target), JSONL/Parquet with source/target fields, or two line-aligned "
                                "files <stem>.<source_lang> and <stem>.<target_lang>; files, directories or globs.")
    source_lang: str = Field("src", min_length=1, pattern=r"^[\w-]+$", description="File suffix of the source side "
                                                                                    "of aligned files (e.g. en).")
    target_lang: str = Field("tgt", min_length=1, pattern=r"^[\w-]+$", description="File suffix of the target side.")
    source_field: str = Field("source", min_length=1, description="JSONL field / Parquet column of the source.")
    target_field: str = Field("target", min_length=1, description="JSONL field / Parquet column of the target.")
    lowercase: bool = Field(False, description="Lowercase both sides.")
    dedupe: bool = Field(True, description="Drop exact duplicate pairs.")
    valid_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of source sentences in the valid split "
                                                                  "(files named after a split keep theirs).")
    test_fraction: float = Field(0.05, ge=0, lt=0.5, description="Share of source sentences in the test split.")
    max_file_bytes: int = Field(4 << 30, ge=1, description="Largest decompressed file accepted, in bytes.")
    bad_files: Literal["fail", "skip"] = Field(
        "fail", description="A malformed pair (no tab, an empty side, invalid UTF-8, a missing field): stop with "
                            "its file:line error, or skip it and count it in the manifest.")


Seq2SeqKind = Literal["rnn", "transformer"]
Seq2SeqParams = section(
    "Seq2SeqParams", TokenizerConfig, RNNSeq2SeqConfig, TransformerSeq2SeqConfig, first=("models",),
    doc="Translation models: tokens, the RNN and Transformer encoder-decoders, training and BLEU evaluation.",
    models=(list[Seq2SeqKind], Field(["rnn"], description="Translation models to train, each its own seq2seq "
                                                           "artifact: rnn, transformer.")),
    **training("Sentence pairs", epochs=1, batch_size=64, lr=2e-3, warmup_steps=100),
    beam_width=(int, Field(5, ge=1, le=256, description="Beam width of the BLEU evaluation (1 = greedy).")),
    length_penalty=(float, Field(1.0, ge=0, le=5, description="Beam scores log P / length^alpha (1: the average "
                                                              "log-probability, 0: none).")),
    eval_sentences=(int, Field(0, ge=0, description="Score BLEU on at most this many valid/test sentences (0: "
                                                    "all).")))


PretrainParams = section(
    "PretrainParams", EncoderConfig, WordPiece,
    doc="The BERT-style encoder: its WordPiece vocabulary, architecture, masked-LM pretraining (docs/pretraining.md).",
    # WordPiece's likelihood score favours pairs of rare symbols: with 2, an 8k vocabulary learned on the Wikipedia
    # excerpt leaves "the" as th ##e (3.3 pieces per EWT word, 1.34 with 50; docs/pretraining.md)
    defaults={"min_frequency": 50},
    pppl_sentences=(int, Field(200, ge=0, description="Held-out sentences scored for the pseudo-perplexity "
                                                      "(one forward pass per token).")),
    # The recipe, chosen on held-out [MASK] loss (benchmarks/results/pretrain_sweep.md); the benchmark's too.
    **training("Sentences", epochs=100, max_steps=4000, batch_size=32, lr=1e-3, warmup_steps=200))
FineTuneTask = Literal["upos", "genre"]
FineTuneMode = Literal["scratch", "frozen", "full", "adapters", "lora"]
FineTuneParams = section(
    "FineTuneParams", FineTuneConfig, first=("tasks", "modes"),
    doc="Fine-tuning the pretrained encoder on the tagged corpus (CoNLL-U sources), one artifact per task and mode.",
    tasks=(list[FineTuneTask], Field([], description="Tasks (empty: no pretraining or fine-tuning runs): upos "
                                                     "(tagging, head on every first sub-token), genre (the sent_id "
                                                     "prefix, as EWT's: head on the mean token state).")),
    modes=(list[FineTuneMode], Field(["scratch", "frozen", "full", "adapters", "lora"], min_length=1, description=(
        "scratch (the same encoder randomly initialised, all trained), frozen (head only), full, adapters "
        "(Houlsby), lora (low-rank updates of every linear map and the token embedding, merged after training)."))),
    train_fraction=(float, Field(1.0, gt=0, le=1, description="Share of the train split's sentences fine-tuned on "
                                                              "(a seeded draw; smaller shares are subsets of larger "
                                                              "ones): the learning curve's x axis.")),
    lrs=(list[Annotated[float, Field(gt=0, le=1)]], Field([], description=(
        "Peak learning rates tried, the best on the valid split kept (empty: the mode's grid, scratch as full: " +
        "; ".join(f"{mode} {', '.join(f'{lr:g}' for lr in grid)}" for mode, grid in LR_GRID.items()) + ")."))),
    # 10 epochs: LoRA's dev loss still falls after 5 at 10 % of EWT; early stopping ends converged runs sooner
    **training("Sentences", tuple(n for n in TRAINING if n != "lr"), epochs=10, batch_size=32, warmup_steps=100,
               patience=2))


# Release checks (models/checks.py): every kind's thresholds, one section; `advisory` demotes checks to reports.
ChecksParams = section(
    "ChecksParams", *(kind.thresholds for kind in checks.CHECKS.values()),
    doc="Checks of each artifact against the version released under the same name (models/checks.py); a release "
        "happens only when every blocking check passes.",
    advisory=(list[str], Field([], description="Checks that are reported but do not block a release: ARTIFACT.CHECK "
                                               "as the checks table names them (e.g. corpus.tokens, "
                                               "lm.ngram.valid_word_perplexity), or KIND.CHECK for every artifact of "
                                               "the kind.")))


class ReleaseParams(Params):
    """Whether a run releases what it built: moves an alias to each new version when every blocking check passes."""

    when: Literal["never", "scheduled", "always"] = Field(
        "scheduled", description="never; scheduled (only a run its deployment's schedule started: a cron rebuild); "
                                 "always (a run from the UI or `lexiflow run --release` too).")
    alias: str = Field("production", pattern=r"^[a-z][a-z0-9_-]{0,62}$",
                       description="The alias the released versions get (KIND@ALIAS, e.g. embeddings@production).")
