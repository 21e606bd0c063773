"""Translation stages: the `parallel_corpus` (sentence pairs with their split) and one `seq2seq` model per kind
(trained translator, BLEU on valid and test, sample translations, attention heatmaps)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl
from lexiflow.models import bleu, ingest, parallel
from lexiflow.models.config import from_section
from lexiflow.storage import ArtifactRef, ArtifactWriter
from lexiflow.storage.formats import PAIRS, read_table
from lexiflow.tasks.corpus import source_fingerprints
from lexiflow.tasks.params import Seq2SeqParams, TranslationCorpusParams
from lexiflow.tasks.stage import stage

# The model modules import torch: the functions that train import them (a cached run imports none).
if TYPE_CHECKING:
    from lexiflow.models.seq2seq import translator

SAMPLES, HEATMAPS = 10, 3  # sample translations in the manifest/report; attention pictures per model


def parallel_options(params: TranslationCorpusParams) -> parallel.ParallelOptions:
    return parallel.ParallelOptions(**params.model_dump(exclude={"sources"}))


def parallel_fingerprint(arguments: dict) -> list[dict]:
    """The corpus version follows the sources' content, not their names."""
    return source_fingerprints(ingest.resolve_sources(arguments["params"].sources))


@stage("parallel_corpus", fingerprint=parallel_fingerprint)
def ingest_parallel(out: ArtifactWriter, params: TranslationCorpusParams) -> None:
    corpus = parallel.read_parallel(list(params.sources), parallel_options(params))
    out.write_parquet("pairs.parquet", corpus.pairs, PAIRS)
    out.metrics.update(corpus.stats)


def make_translator(model: str, p: Seq2SeqParams, checkpoint_dir: str | None) -> translator.Translator:
    from lexiflow.models.lm import train
    from lexiflow.models.seq2seq import translator

    config_class = translator.MODELS[model][1]
    schedule = from_section(train.TrainConfig, p, checkpoint_dir=checkpoint_dir, clip_grad_norm=1.0)
    return translator.Translator(model, from_section(config_class, p), from_section(translator.TokenizerConfig, p),
                                 schedule)


def _references(src: list[str], tgt: list[str]) -> tuple[list[str], list[list[str | None]]]:
    """Each distinct source once, with every translation of it in the split as its references."""
    by_source: dict[str, list[str]] = {}
    for s, t in zip(src, tgt, strict=True):
        by_source.setdefault(s, []).append(t)
    width = max((len(v) for v in by_source.values()), default=1)
    sources = list(by_source)
    return sources, [[by_source[s][k] if k < len(by_source[s]) else None for s in sources] for k in range(width)]


@stage("seq2seq")
def train_seq2seq(out: ArtifactWriter, pairs: ArtifactRef, model: str, params: Seq2SeqParams) -> None:
    from lexiflow.models.seq2seq import plots, translator

    table = read_table(pairs, "pairs.parquet")
    data = {s: (part["source"].to_list(), part["target"].to_list())
            for s in ("train", "valid", "test") for part in [table.filter(pl.col("split") == s)]}
    tr = make_translator(model, params, str(out.scratch))
    tr.fit(*data["train"], valid=data["valid"] if data["valid"][0] else None)
    tr.save(out.folder)
    metrics: dict = {"model": model, "parameters": translator.count_parameters(tr.module_),
                     "train_pairs": len(data["train"][0]), "beam_width": params.beam_width}
    for split in ("valid", "test"):
        src, tgt = data[split]
        if not src:
            metrics[f"{split}_bleu"] = metrics[f"{split}_chrf"] = None
            continue
        src, tgt = src[: params.eval_sentences or None], tgt[: params.eval_sentences or None]
        sources, refs = _references(src, tgt)  # all translations of a source sentence are its references
        hyps = tr.translate(sources, beam_width=params.beam_width, alpha=params.length_penalty)
        metrics[f"{split}_bleu"] = bleu.corpus_bleu(hyps, refs).score
        metrics[f"{split}_chrf"] = bleu.corpus_chrf(hyps, refs)
        metrics[f"{split}_sentences"] = len(sources)
        if split == "valid":
            samples = [{"source": s, "translation": h, "references": [r[i] for r in refs if r[i] is not None]}
                       for i, (s, h) in enumerate(zip(sources[:SAMPLES], hyps[:SAMPLES], strict=False))]
            out.write_text("samples.json", json.dumps(samples, ensure_ascii=False, indent=1))
            for i, t in enumerate(tr.translate(sources[:HEATMAPS], return_attention=True)):
                if t.attention is not None:
                    plots.attention_heatmap(t.source_tokens, t.target_tokens, t.attention,
                                            out.path(f"attention-{i}.png"), f"{model}: {t.text}")
    out.metrics.update(metrics)
