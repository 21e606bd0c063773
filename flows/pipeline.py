"""The `pipeline` flow. Read top to bottom, like a recipe:

corpus → word vocabulary → tokenized corpus → co-occurrence → PPMI → embeddings → evaluation
                         ↘ (word or subword tokens) → language models ↗        → report
parallel sources → parallel corpus → translation models (seq2seq) ↗
corpus → encoder (masked LM) → fine-tuned classifiers (tagged corpus: UPOS, genre; each mode) ↗

Every task returns a small `ArtifactRef`; data travels through the artifact store only.
"""

from __future__ import annotations

import inspect
from typing import Any

from lexiflow.flows.params import PipelineParams, args_doc, flow_signature, validate
from lexiflow.flows.release import publish_checks, release, released_versions
from lexiflow.flows.training import (
    EMBEDDING_TRAINERS,
    FINETUNE_TRAINERS,
    LM_TRAINERS,
    PRETRAIN_TRAINERS,
    SEQ2SEQ_TRAINERS,
    TAGGER_TRAINERS,
    train,
)
from lexiflow.models import ingest
from lexiflow.storage import ArtifactRef, ArtifactStore
from lexiflow.tasks.checks import check_artifacts
from lexiflow.tasks.corpus import ingest_corpus, ingest_tagged
from lexiflow.tasks.evaluation import evaluate_embeddings
from lexiflow.tasks.matrices import compute_ppmi, count_cooccurrence
from lexiflow.tasks.report import publish_lineage, publish_report, write_report
from lexiflow.tasks.stage import MustRun, looking_up, lookup_only, published_manifest
from lexiflow.tasks.tagger import train_tagger
from lexiflow.tasks.translation import ingest_parallel
from lexiflow.tasks.vocabulary import encode_corpus, learn_subword, learn_vocabulary
from prefect import flow, get_run_logger


def build_all(**sections: Any) -> dict[str, ArtifactRef]:
    """Build every artifact from the corpus sources; unchanged stages are reused, not recomputed.
    CoNLL-U sources also give a tagged corpus and a tagger per kind and tag set; parallel sources
    (`translation.sources`) a parallel corpus and a translation model per `seq2seq.models` kind. Training
    stages run here, or on the `gpu` work pool when `training.remote` is set."""
    p = validate(sections)  # deployed runs arrive as plain values: the checks across sections, up front
    store, corpus, embeddings, lm, neural, tagger, training = (
        p.store, p.corpus, p.embeddings, p.lm, p.neural, p.tagger, p.training)
    parallel = p.parallel
    ArtifactStore(store).check_root()
    docs = ingest_corpus(store, params=corpus, parallel=parallel)
    words = learn_vocabulary(store, corpus=docs, params=p.vocabulary, parallel=parallel)
    word_ids = encode_corpus(store, corpus=docs, tokenizer=words, parallel=parallel)

    counts = count_cooccurrence(store, tokens=word_ids, tokenizer=words, params=p.cooccurrence, parallel=parallel)
    # Training stages run here, or on the gpu work pool when training.remote is set (flows/training.py).
    vectors: dict[str, ArtifactRef] = {}
    for method in embeddings:
        if method == "svd":
            pmi = compute_ppmi(store, cooccurrence=counts, params=p.ppmi)
            inputs, params = {"ppmi": pmi}, p.svd
        elif method in ("glove", "lsi"):
            inputs, params = {"cooccurrence": counts}, getattr(p, method)
        else:
            inputs, params = {"corpus": docs, "tokenizer": words}, p.word2vec
        vectors[method] = train(EMBEDDING_TRAINERS[method], method, store, inputs, params, training)
    evaluations = {name: evaluate_embeddings(store, embeddings=ref, params=p.evaluation)
                   for name, ref in vectors.items()}

    lms, subword = {}, {}
    if lm:
        lm_tokenizer, lm_ids = words, word_ids
        if p.tokenizer.kind != "word":
            lm_tokenizer = learn_subword(store, corpus=docs, params=p.tokenizer)
            lm_ids = encode_corpus(store, corpus=docs, tokenizer=lm_tokenizer, parallel=parallel)
            subword = {f"tokenizer.{p.tokenizer.kind}": lm_tokenizer, f"tokenized_corpus.{p.tokenizer.kind}": lm_ids}
        for kind in lm:
            inputs = {"tokens": lm_ids, "tokenizer": lm_tokenizer,
                      "embeddings": None if kind == "ngram" else vectors.get(neural.pretrained)}
            lms[kind] = train(LM_TRAINERS[kind], kind, store, inputs, p.ngram if kind == "ngram" else neural, training)

    taggers, tagged, bilm = {}, None, None
    skipped = {s["source"] for s in published_manifest(docs)["metrics"].get("skipped", [])}
    if any(str(path) not in skipped for path in ingest.tagged_files(ingest.resolve_sources(corpus.sources))):
        tagged = ingest_tagged(store, params=corpus)
        if "bilstm+elmo" in tagger.kinds:
            bilm = train(TAGGER_TRAINERS["elmo"], "elmo", store, {"corpus": docs}, p.elmo, training)
        for kind in tagger.kinds:
            for column in tagger.columns:
                if kind == "hmm":  # CPU, seconds: always here
                    ref = train_tagger(store, tagged=tagged, column=column, params=tagger)
                else:
                    ref = train(TAGGER_TRAINERS[f"{kind}:{column}"], f"{kind}:{column}", store,
                                {"tagged": tagged, "elmo": bilm if kind == "bilstm+elmo" else None,
                                 "vectors": vectors.get(tagger.pretrained)}, tagger, training)
                taggers[column if kind == "hmm" else f"{kind}.{column}"] = ref

    encoder, finetuned = None, {}
    if p.finetune.tasks and tagged is not None:  # the encoder, then one classifier per task and mode
        encoder = train(PRETRAIN_TRAINERS["encoder"], "encoder", store, {"corpus": docs}, p.pretrain, training)
        finetuned = {f"{task}-{mode}": train(FINETUNE_TRAINERS[f"{task}-{mode}"], f"{task}-{mode}", store,
                                             {"encoder": encoder, "tagged": tagged}, p.finetune, training)
                     for task in p.finetune.tasks for mode in p.finetune.modes}

    pairs, translators = None, {}
    if p.translation.sources:  # parallel sources: a parallel corpus and a translation model per kind
        pairs = ingest_parallel(store, params=p.translation)
        translators = {kind: train(SEQ2SEQ_TRAINERS[kind], kind, store, {"pairs": pairs}, p.seq2seq, training)
                       for kind in p.seq2seq.models}

    refs = {"corpus": docs, "tokenizer": words, "tokenized_corpus": word_ids, "cooccurrence": counts,
            **({"ppmi": pmi} if "svd" in vectors else {}), **subword,
            **({"tagged_corpus": tagged} if tagged else {}),
            **{f"embeddings.{k}": v for k, v in vectors.items()},
            **{f"evaluation.{k}": v for k, v in evaluations.items()},
            **{f"lm.{k}": v for k, v in lms.items()}, **{f"tagger.{k}": v for k, v in taggers.items()},
            **({"parallel_corpus": pairs} if pairs else {}), **{f"seq2seq.{k}": v for k, v in translators.items()},
            **({"elmo": bilm} if bilm is not None else {}),
            **({"encoder": encoder} if encoder else {}), **{f"finetuned.{k}": v for k, v in finetuned.items()}}
    # Each artifact against the version released under its name (flows/release.py), before the report shows it.
    checked = check_artifacts(store, candidates=refs, released=released_versions(refs, p.release.alias) or None,
                              params=p.checks)
    report = write_report(store, evaluations=list(evaluations.values()), lms=list(lms.values()) or None,
                          taggers=list(taggers.values()) or None, translations=list(translators.values()) or None,
                          finetuned=list(finetuned.values()) or None, checks=checked)
    refs.update({"checks": checked, "report": report})
    if looking_up():  # `reuse_all`, without Prefect: nothing to show; a run that releases goes through Prefect
        if p.release.when == "always":  # `scheduled` releases only a scheduled flow run, never a CLI run
            raise MustRun("release")
        return refs
    publish_report(report)
    results = published_manifest(checked)["metrics"]["results"]
    publish_checks(checked, results)
    publish_lineage(refs)  # on this run, reused artifacts included
    get_run_logger().info("pipeline: %s", ", ".join(f"{name}={ref.version}" for name, ref in refs.items()))
    release(refs, checked, results, p.release)  # last: a refused release fails the run after all is shown
    return refs


# The flow's signature and the docstring's Args (the UI form) derive from PipelineParams.
build_all.__signature__ = flow_signature(PipelineParams)
build_all.__doc__ = f"{inspect.cleandoc(build_all.__doc__)}\n\n{args_doc(PipelineParams)}"
pipeline = flow(name="pipeline", log_prints=True)(build_all)


def run_pipeline(params: PipelineParams) -> dict[str, ArtifactRef]:
    return pipeline(**{name: getattr(params, name) for name in PipelineParams.model_fields})


def reuse_all(params: PipelineParams) -> dict[str, ArtifactRef] | None:
    """What `run_pipeline` returns when the store already holds every artifact it would make, found without
    Prefect (the recipe above with each stage only looking its version up: `stage.lookup_only`); None as
    soon as one stage must run, or a read fails (the run, with its retries, then does it again). Nothing is
    written, and no flow run is recorded."""
    try:
        with lookup_only():
            return build_all(**{name: getattr(params, name) for name in PipelineParams.model_fields})
    except (MustRun, OSError):
        return None
