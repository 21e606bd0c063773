"""What builds each kind of artifact: the one table the "not found" errors take their next step from
(`Catalog.get`, hence `lexiflow.loaders.load` and every command that reads the store).

Text only, so that `storage/` imports no pipeline code; tests/test_cli.py checks that every command
here is one `lexiflow run` accepts.
"""

from __future__ import annotations

from typing import Any

CONLLU = "--corpus TREEBANK.conllu"
PAIRS = "--set 'translation.sources=[\"PAIRS.tsv\"]'"
FINETUNE = f"{CONLLU} --set 'finetune.tasks=[\"upos\"]'"

# kind: (the options of `lexiflow run` that build one, those that build the one tagged {value}); "" is the default
# run, which builds the corpus, word vocabulary and tokens, co-occurrence, PPMI, SVD and skip-gram embeddings and
# their evaluations, an n-gram LM, the release checks and the report.
BUILT_BY: dict[str, tuple[str, str]] = {
    "corpus": ("", ""),
    "tokenizer": ("", "--set tokenizer.kind={value}"),
    "tokenized_corpus": ("", ""),
    "cooccurrence": ("", ""),
    "ppmi": ("", ""),
    "embeddings": ("", "--set 'embeddings=[\"{value}\"]'"),
    "evaluation": ("", "--set 'embeddings=[\"{value}\"]'"),
    "lm": ("", "--set 'lm=[\"{value}\"]'"),
    "checks": ("", ""),
    "report": ("", ""),
    "tagged_corpus": (CONLLU, CONLLU),
    "tagger": (CONLLU, f"{CONLLU} --set 'tagger.columns=[\"{{value}}\"]'"),
    "elmo": (f"{CONLLU} --set 'tagger.kinds=[\"bilstm+elmo\"]'",) * 2,
    "encoder": (FINETUNE, FINETUNE),
    "finetuned": (FINETUNE, FINETUNE),
    "parallel_corpus": (PAIRS, PAIRS),
    "seq2seq": (PAIRS, PAIRS),
}


def next_step(kind: str, store: str, selector: dict[str, Any] | None = None) -> str:
    """What to do about a missing `kind` artifact (with `selector`'s tag): the `lexiflow run` that builds it."""
    if kind not in BUILT_BY:
        return f"`lexiflow artifacts list --store {store}` shows what the store holds"
    options = BUILT_BY[kind][1 if selector else 0].format(value=next(iter((selector or {None: ""}).values())))
    return f"build one: lexiflow run --store {store}{' ' if options else ''}{options}"
