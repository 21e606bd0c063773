"""Pretraining and fine-tuning: does an MLM-pretrained encoder (and a GPT-style LM) beat the same network from
scratch on EWT UPOS tagging and EWT genre classification; how close LoRA and adapters come to full fine-tuning.

Pretraining corpus: every text the project has (gensim's Wikipedia excerpt, WikiText-2 valid, EWT *train*
text), ingested as the pipeline does (lowercased, sentence-split, deduplicated); the ingest split's `valid`
sentences are the MLM's held-out set. EWT dev and test sentences are never pretrained on. One WordPiece
vocabulary (learned on the pretraining train text) serves the encoder, the decoder LM and fine-tuning.
Fine-tuning: EWT train; early stopping on the dev loss; LoRA's learning rate chosen per task
on dev accuracy (below); test scored once per configuration, for the chosen run, at the end. Nothing is
tuned on test. CPU-only figures, one thread, taken on the shared 2-core machine under other engineers' load.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

import numpy as np
import torch
from lexiflow.models.encoder import BERT_SPECIALS, EncoderConfig, EncoderModel, MaskedLM
from lexiflow.models.finetune import GENRES, UPOS_TAGS, Classifier, FineTuneConfig, accuracy, ewt_examples, finetune
from lexiflow.models.ingest import IngestOptions, build_corpus, resolve_sources
from lexiflow.models.lm.train import TrainConfig
from lexiflow.models.lm.transformer import Transformer, TransformerConfig, TransformerLM
from lexiflow.models.tokenizers.wordpiece import WordPiece

from benchmarks.harness import SHARED_DATA, Row

EWT = SHARED_DATA / "ud-english-ewt"
WIKITEXT_VALID = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
TASKS = {"upos": UPOS_TAGS, "genre": GENRES}


def pretraining_text(quick: bool) -> tuple[list[str], list[str]]:
    """(train sentences, held-out sentences) of the pretraining corpus, lowercased."""
    sources = resolve_sources(["builtin:enwiki"]) + [WIKITEXT_VALID, EWT / "en_ewt-ud-train.conllu"]
    docs = build_corpus(sources, IngestOptions(lowercase=True)).documents
    split = {}
    for name in ("train", "valid"):
        texts = docs.filter(docs["split"] == name)["text"].str.split("\n").explode()
        split[name] = [t for t in texts.to_list() if t and len(t.split()) >= 3]
    if quick:
        return split["train"][:3000], split["valid"][:200]
    return split["train"], split["valid"]


# The budget (about an hour of the shared machine, from measured rates: MLM 7-15k tokens/s, fine-tuning 6-15k
# tokens/s on one thread of the shared machine): the MLM sees the pretraining text MLM_EPOCHS times with fresh
# masks, the GPT-style LM LM_EPOCHS times; each fine-tuning run trains up to FT_EPOCHS epochs of EWT train,
# stopped early on the dev loss. A larger machine sets them from the environment, e.g. on a GPU
# FINETUNE_EPOCHS=60,10,5 python -m benchmarks finetune (docs/pretraining.md).
MLM_EPOCHS, LM_EPOCHS, FT_EPOCHS = (int(n) for n in os.environ.get("FINETUNE_EPOCHS", "4,1,2").split(","))
# Learning rates chosen on EWT dev accuracy, per task and configuration, inside the run (test is scored
# once, for the chosen one): full fine-tuning and training from scratch use FULL_LR, the frozen body (a linear
# probe) FEW_LRS[-1], adapters FEW_LRS[0]; LoRA takes the best of FEW_LRS (the modes that train few weights
# usually want a larger step; only LoRA has a target, and the CPU allowed one grid).
FULL_LR, FEW_LRS = 1e-3, (3e-3, 1e-2)
# WordPiece's likelihood score count(ab) / (count(a) count(b)) favours pairs of rare symbols: with the
# default min_frequency=2 a 4000-8000 vocabulary fills with rare-script pairs and long prefix chains and
# "the" stays th ##e (3.3 pieces per EWT word); a pair must occur 50 times here (1.34 pieces per word).
VOCAB, MIN_PAIR_COUNT = 8000, 50
# LoRA rank 8 (alpha 16) on the 8 attention projections: ~1.3 % of the encoder's parameters with the head.
LORA_RANK, LORA_ALPHA, ADAPTER_SIZE = 8, 16.0, 16


def run(quick: bool = False) -> list[Row]:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log = logging.getLogger("lexiflow.benchmark")
    t0 = time.perf_counter()
    train_text, held_text = pretraining_text(quick)
    tok = WordPiece(vocab_size=2000 if quick else VOCAB, min_frequency=5 if quick else MIN_PAIR_COUNT,
                    special_tokens=BERT_SPECIALS).fit(train_text)
    size = dict(d_model=128, n_layers=2, n_heads=4, max_len=128)

    def enc(texts: list[str]) -> list[np.ndarray]:  # long lines (WikiText paragraphs) in pieces that fit
        out = [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
        step = size["max_len"] - 2
        return [ids[i:i + step] for ids in out for i in range(0, len(ids), step)]

    train_ids, held_ids = enc(train_text), enc(held_text)[:500]
    n_tokens = sum(map(len, train_ids))
    log.info("pretraining corpus: %d sentences, %d WordPiece tokens (%.0fs)", len(train_ids), n_tokens,
             time.perf_counter() - t0)
    mlm_epochs, lm_epochs, ft_epochs = (1, 1, 1) if quick else (MLM_EPOCHS, LM_EPOCHS, FT_EPOCHS)
    pre_cfg = TrainConfig(epochs=mlm_epochs, max_steps=40 if quick else None, batch_size=64, lr=2e-3,
                          warmup_steps=40 if quick else 300, clip_grad_norm=1.0, checkpoint_every=0,
                          weight_decay=0.01, log_every_s=60)
    mlm = MaskedLM(EncoderConfig(vocab_size=tok.vocab_size, d_ff=512, **size), pre_cfg)
    mlm.fit(train_ids, held_ids, pppl_sentences=20 if quick else 50)
    case = f"MLM pretraining, {mlm_epochs} epochs of {n_tokens} WordPiece tokens"
    rows = [Row("finetune", case, metric, mlm.metrics[key],
                higher_is_better=metric != "pseudo-perplexity",
                notes=f"encoder d=128, 2 layers, {mlm.n_parameters} parameters; held-out = the ingest valid split; "
                      "1 thread, shared machine under load")
            for metric, key in (("held-out masked-LM accuracy", "masked_lm_accuracy"),
                                ("pseudo-perplexity", "pseudo_perplexity"),
                                ("pretraining tokens/s", "tokens_per_s"))]
    gpt = TransformerLM(TransformerConfig(vocab_size=tok.vocab_size, dropout=0.1, **size),
                        replace(pre_cfg, bptt=128, batch_size=16, epochs=lm_epochs)).fit(train_ids)
    rows.append(Row("finetune", f"GPT-style LM pretraining, {lm_epochs} epochs of 16 x 128 tokens", "held-out ppl",
                    gpt.perplexity(held_ids), higher_is_better=False, notes="same WordPiece vocabulary and size"))

    # each kind's body: (module class, its config, the pretrained weights); from scratch: the same seed's init
    bodies = {"encoder": (EncoderModel, mlm.config, mlm.model), "decoder": (Transformer, gpt.config, gpt.module_)}

    def make_body(kind: str, pretrained: bool):
        module_class, config, trained = bodies[kind]
        torch.manual_seed(0)
        body = module_class(config)
        if pretrained:
            body.load_state_dict(trained.state_dict())
        return body

    limit = 600 if quick else None
    for task, labels in TASKS.items():
        data = {split: ewt_examples(EWT / f"en_ewt-ud-{split}.conllu", tok, task, labels, max_len=128)[:limit]
                for split in ("train", "dev", "test")}
        runs = [("encoder", "scratch", "full"), ("encoder", "mlm", "frozen"), ("encoder", "mlm", "full"),
                ("encoder", "mlm", "adapters"), ("encoder", "mlm", "lora"),
                ("decoder", "scratch", "full"), ("decoder", "lm", "full")]
        results = {}
        for body_kind, start, mode in runs:
            best = None
            lrs = {"full": (FULL_LR,), "frozen": FEW_LRS[-1:], "adapters": FEW_LRS[:1], "lora": FEW_LRS}[mode]
            for lr in lrs:  # chosen on dev accuracy
                model = Classifier(make_body(body_kind, start != "scratch"), "token" if task == "upos" else "sequence",
                                   len(labels))
                cfg = TrainConfig(epochs=ft_epochs, batch_size=32, lr=lr, warmup_steps=100, clip_grad_norm=1.0,
                                  checkpoint_every=0, patience=1, log_every_s=60)
                m = finetune(model, FineTuneConfig(mode=mode, lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA,
                                                   adapter_size=ADAPTER_SIZE), data["train"], data["dev"], cfg)
                log.info("%s %s %s %s lr %g: dev accuracy %.4f after %d epochs", task, body_kind, start, mode, lr,
                         m["dev_accuracy"], m["epochs"])
                if best is None or m["dev_accuracy"] > best[2]["dev_accuracy"]:
                    best = (lr, model, m)
            lr, model, m = best
            test = accuracy(model, data["test"])
            log.info("%s %s %s %s: chose lr %g; test accuracy %.4f", task, body_kind, start, mode, lr, test)
            results[(body_kind, start, mode)] = test
            case = f"EWT {task} test, {body_kind} {'from scratch' if start == 'scratch' else 'pretrained'}, {mode}"
            rows.append(Row("finetune", case, "accuracy", test,
                            notes=f"dev {m['dev_accuracy']:.4f}; trainable {m['trainable']} of {m['total']} "
                                  f"({100 * m['trainable_share']:.2f} %); {m['epochs']} epochs of 32-sentence "
                                  f"batches; lr {lr:g} (chosen on dev)"))
            rows.append(Row("finetune", case, "fine-tuning tokens/s", m["tokens_per_s"],
                            notes="1 thread, shared machine under load"))
        full, scratch = results[("encoder", "mlm", "full")], results[("encoder", "scratch", "full")]
        rows.append(Row("finetune", f"EWT {task} test: pretrained vs from scratch (encoder, full)", "accuracy", full,
                        scratch, "same encoder from scratch", target="ours > peer", met=full > scratch))
        lora = results[("encoder", "mlm", "lora")]
        rows.append(Row("finetune", f"EWT {task} test: LoRA vs full (encoder)", "accuracy", lora, full,
                        "full fine-tuning", target=">= peer - 0.01", met=lora >= full - 0.01))
        gfull, gscratch = results[("decoder", "lm", "full")], results[("decoder", "scratch", "full")]
        rows.append(Row("finetune", f"EWT {task} test: pretrained vs from scratch (GPT-style decoder, full)",
                        "accuracy", gfull, gscratch, "same decoder from scratch", target="ours > peer",
                        met=gfull > gscratch))
    return rows
