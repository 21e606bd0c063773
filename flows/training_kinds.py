"""The table of trainer kinds: each training flow (deployed under its own name on the `gpu` pool), the artifact
kinds its trainers make, and what it trains. Derived from it: the flows themselves and their trainer tables
(flows/training.py), their deployments (deployments/definitions.py) and the pipeline's
`training.<family>_deployment` settings (flows/params.py). A light module (no imports), so the deployment
definitions read it without importing the models.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingFlow:
    family: str  # the trainers' family: flows/training.py's TRAINERS key, `training.<family>_deployment`
    name: str  # the flow's name, and its deployment's
    entrypoint: str  # its name in flows/training.py (the deployment's entrypoint)
    kinds: tuple[str, ...]  # the artifact kinds its trainers make
    what: str  # "word embeddings from artifacts in the store": descriptions of the flow, setting and deployment


TRAINING_FLOWS: tuple[TrainingFlow, ...] = (
    TrainingFlow("embeddings", "train-embeddings", "train_embeddings", ("embeddings",),
                 "word embeddings from artifacts in the store"),
    TrainingFlow("lm", "train-lm", "train_lm", ("lm",), "a language model on the tokenized corpus in the store"),
    TrainingFlow("seq2seq", "train-seq2seq", "train_seq2seq", ("seq2seq",),
                 "a translation model (RNN or Transformer encoder-decoder) on the parallel corpus in the store"),
    TrainingFlow("tagger", "train-tagger", "train_tagger_flow", ("tagger", "elmo"),
                 "a neural part-of-speech tagger (BiLSTM, BiLSTM+ELMo) or the ELMo biLM from artifacts in the store"),
    TrainingFlow("pretrain", "pretrain", "pretrain", ("encoder",),
                 "the BERT-style encoder (masked LM) on the corpus in the store"),
    TrainingFlow("finetune", "finetune", "finetune", ("finetuned",),
                 "the pretrained encoder fine-tuned on the tagged corpus in the store (method <task>-<mode>)"),
)
