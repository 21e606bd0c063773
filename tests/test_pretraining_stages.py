"""The `encoder` and `finetuned` stages (tasks/pretraining.py) on a tiny EWT slice, and the report's table."""

from pathlib import Path

import pytest
import torch
from lexiflow.loaders import load
from lexiflow.models.config import from_section
from lexiflow.models.conllu import format_sentence, read_conllu
from lexiflow.models.encoder import BERT_SPECIALS
from lexiflow.models.errors import InputError
from lexiflow.models.finetune_config import LR_GRID
from lexiflow.models.tokenizers.wordpiece import WordPiece
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.storage.formats import read_manifest
from lexiflow.tasks.corpus import ingest_corpus, ingest_tagged
from lexiflow.tasks.params import CorpusParams, FineTuneParams, PretrainParams
from lexiflow.tasks.pretraining import finetune, pretrain
from lexiflow.tasks.report import _finetune_section

from tests.stages import publish

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt"
if not EWT.exists():
    EWT = Path("/work/shared/data/ud-english-ewt")
TINY = dict(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=32, vocab_size=300, epochs=1, max_steps=4,
            batch_size=16, checkpoint_every=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretraining")
    for split, n in (("train", 120), ("dev", 40), ("test", 40)):
        sentences = [s for _, s in zip(range(n), read_conllu(EWT / f"en_ewt-ud-{split}.conllu"), strict=False)]
        (root / f"en_ewt-ud-{split}.conllu").write_text("".join(format_sentence(s) for s in sentences))
    s = ArtifactStore(str(root / "store"))
    params = CorpusParams(sources=[str(root / f"en_ewt-ud-{x}.conllu") for x in ("train", "dev", "test")])
    s.docs = publish(s, ingest_corpus, params=params)
    s.tagged = publish(s, ingest_tagged, params=params)
    return s


def test_pretrain_then_finetune_publish_artifacts_and_the_report_table(store):
    encoder = publish(store, pretrain, corpus=store.docs, params=PretrainParams(**TINY, pppl_sentences=3))
    metrics = read_manifest(encoder)["metrics"]
    assert 0 <= metrics["mask_accuracy"] <= 1 and metrics["pseudo_perplexity"] > 1
    assert metrics["unigram_perplexity"] > 1 and metrics["mask_tokens"] > 0
    mlm = load(store, "encoder")
    assert mlm.tokenizer is not None and mlm.tokenizer.token_to_id("[MASK]") == 4
    params = FineTuneParams(tasks=["upos", "genre"], lora_rank=2, adapter_size=4, train_fraction=0.5,
                            **{k: v for k, v in TINY.items() if k in FineTuneParams.model_fields})
    refs = [publish(store, finetune, encoder=encoder, tagged=store.tagged, task=task, mode=mode, params=params)
            for task, mode in (("upos", "lora"), ("genre", "scratch"))]
    lora, scratch = (read_manifest(r)["metrics"] for r in refs)
    assert lora["evaluated_on"] == "test" and 0 <= lora["accuracy"] <= 1
    assert lora["train_sentences"] == 60 and lora["train_fraction"] == 0.5  # half of the 120 train sentences
    assert lora["trainable_share"] < 0.5 and scratch["trainable"] == scratch["total"]
    # every rate of LoRA's grid with the body's dropout, then the body without dropout at the best one: dev keeps one
    grid = [f"dev_accuracy_lr_{lr:g}" for lr in LR_GRID["lora"]]
    best = max(grid, key=lora.get)
    tried = {k: v for k, v in lora.items() if k.startswith("dev_accuracy_lr_")}
    assert set(tried) == {*grid, f"{best}_body_dropout_0"}
    assert lora["dev_accuracy"] == max(tried.values())
    assert lora["body_dropout"] == (0.0 if lora[f"{best}_body_dropout_0"] > lora[best] else mlm.config.dropout)
    assert "body_dropout_0" not in " ".join(scratch) and scratch["body_dropout"] == mlm.config.dropout
    tagger = load(store, "finetuned", refs[0].version)  # LoRA merged into plain Linear layers
    assert tagger.labels[0] == "ADJ" and not any(type(m).__name__ == "LoRALinear" for m in tagger.modules())
    ids = torch.tensor([[1] + [i for w in tagger.tokenizer.encode_words(["the", "dog"]) for i in w] + [2]])
    assert tagger(ids).shape[-1] == 17
    table = "\n".join(_finetune_section(refs))
    assert "| upos | lora |" in table and "| genre | scratch |" in table
    assert f"accuracy {metrics['mask_accuracy']:.3f}, perplexity" in table  # as the report rounds


def test_a_corpus_without_genre_prefixes_is_a_clear_error(store, tmp_path):
    conllu = tmp_path / "x-ud-train.conllu"
    conllu.write_text("# sent_id = novel-1\n1\tHi\t_\tINTJ\tUH\t_\t_\t_\t_\t_\n\n")
    s = ArtifactStore(str(tmp_path / "store"))
    params = CorpusParams(sources=[str(conllu)])
    tagged = publish(s, ingest_tagged, params=params)
    encoder = publish(store, pretrain, corpus=store.docs, params=PretrainParams(**TINY, pppl_sentences=3))
    with pytest.raises(InputError, match="does not start with a genre"):
        publish(s, finetune, encoder=encoder, tagged=tagged, task="genre", mode="full", params=FineTuneParams())
    assert "finetuned" not in Catalog(s).kinds()  # nothing published


def test_the_pipeline_wordpiece_keeps_frequent_words_whole():
    # WordPiece's likelihood score merges rare pairs first: with min_frequency=2 this text's vocabulary leaves
    # "the" as th ##e (checked by hand); the section's default (50) keeps the frequent words whole
    text = [" ".join(s.words).lower() for _, s in zip(range(4000), read_conllu(EWT / "en_ewt-ud-train.conllu"),
                                                      strict=False)]
    tokenizer = from_section(WordPiece, PretrainParams(), special_tokens=BERT_SPECIALS).fit(text)
    assert [tokenizer.vocab_[i] for i in tokenizer.encode("the head of an investment firm")][:4] == \
        ["the", "hea", "##d", "of"]
