"""Every stage chooses its thread count: the `threads` field of its parameters (default 1 per
worker) bounds torch, the BLAS/OpenMP pools and lexiflow's own polars fan-out while it runs, is
restored after, and never changes an artifact's version (it says how, not what)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from lexiflow.models.errors import ParameterError
from lexiflow.models.ingest.stats import in_threads
from lexiflow.models.lm.rnn import RNN, RNNConfig
from lexiflow.models.lm.train import TrainConfig, train
from lexiflow.models.threads import DEFAULT_THREADS, current_threads, limit_threads
from lexiflow.storage import ArtifactStore
from lexiflow.tasks import params as P
from lexiflow.tasks.corpus import ingest_corpus
from lexiflow.tasks.params import CorpusParams
from lexiflow.tasks.stage import stage
from prefect.testing.utilities import prefect_test_harness
from threadpoolctl import threadpool_info


def test_every_section_with_numeric_work_has_a_threads_field_defaulting_to_one_per_worker():
    for section in (P.CorpusParams, P.SVDParams, P.LSIParams, P.GloVeParams, P.EvaluationParams, P.NeuralLMParams,
                    P.TaggerParams, P.ElmoParams, P.Seq2SeqParams, P.PretrainParams, P.FineTuneParams):
        field = section.model_fields["threads"]
        assert field.default == DEFAULT_THREADS == 1, section.__name__
        with pytest.raises(ValueError):
            section(threads=0)


def test_threads_never_change_a_version(tmp_path):
    store = str(tmp_path)
    one = ingest_corpus.version_of({"store": store, "params": CorpusParams(sources=["builtin:lee"])})
    four = ingest_corpus.version_of({"store": store, "params": CorpusParams(sources=["builtin:lee"], threads=4)})
    other = ingest_corpus.version_of({"store": store, "params": CorpusParams(sources=["builtin:lee"], dedupe=False)})
    assert one == four != other


def test_a_stage_runs_inside_its_limit_and_restores_the_process_setting(tmp_path):
    seen = {}

    @stage("probe_threads")
    def probe(out, params: P.GloVeParams) -> None:
        seen["torch"] = torch.get_num_threads()
        seen["blas"] = {p["num_threads"] for p in threadpool_info()}
        seen["fan_out"] = current_threads(64)
        out.write_json("seen.json", seen)

    torch.set_num_threads(2)
    try:
        with prefect_test_harness(server_startup_timeout=120):
            ref = probe(store=str(tmp_path), params=P.GloVeParams(threads=3))
        assert seen == {"torch": 3, "blas": {3}, "fan_out": 3}
        assert torch.get_num_threads() == 2 and current_threads(64) == 64  # no limit outside a stage
    finally:
        torch.set_num_threads(1)
    assert ArtifactStore(str(tmp_path)).exists(ref.kind, ref.version)


def test_the_polars_fan_out_follows_the_limit():
    rows = pl.Series("text", ["word " * 300_000] * 8)  # 12 MB: two slices where two threads are allowed
    with limit_threads(1):
        assert len(in_threads(lambda part: part.len(), rows)) == 1
    assert len(in_threads(lambda part: part.len(), rows)) == min(pl.thread_pool_size(), 2)
    with pytest.raises(ParameterError, match="corpus.threads=0"), limit_threads(0, "corpus.threads"):
        pass


def test_the_training_loop_trains_on_its_threads():
    module = RNN(RNNConfig(vocab_size=12, emb_dim=8, hidden_dim=8, num_layers=1))
    stream = np.random.default_rng(0).integers(2, 12, size=200)
    seen = []
    torch.set_num_threads(2)
    try:
        train(module, stream, None, TrainConfig(epochs=1, batch_size=2, bptt=4, device="cpu", threads=1),
              bos_id=0, pad_id=1, window=4, on_step=lambda step, loss: seen.append(torch.get_num_threads()))
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
