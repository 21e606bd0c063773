"""The CUDA paths, on a machine with a GPU (skipped elsewhere: CI has none): `pytest tests/test_cuda.py`, or the
whole device check, `python -m benchmarks device` (docs/operations.md).

The rest of the suite's known answers are CPU fp32 numbers, so its models run on the CPU whatever the
machine; here they train on `cuda` with the default precision (bf16 autocast for the LMs), and are
held to what that precision allows: the same quality bars as on the CPU, probabilities that sum to 1,
and a saved model that scores like the one in memory."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from lexiflow.models.attention import _fused_attention
from lexiflow.models.elmo import BiLM, BiLMConfig
from lexiflow.models.encoder import BERT_SPECIALS, EncoderConfig, EncoderModel, MLMTask
from lexiflow.models.finetune import UPOS_TAGS, Classifier, FineTuneConfig, accuracy, ewt_examples, finetune, merge_lora
from lexiflow.models.glove import GloVe
from lexiflow.models.lm import registry
from lexiflow.models.lm.rnn import RNN, RNNLM, RNNConfig
from lexiflow.models.lm.stream import to_stream
from lexiflow.models.lm.train import LMStreamTask, TrainConfig, Trainer
from lexiflow.models.lm.transformer import Transformer, TransformerLM
from lexiflow.models.neural_tagger import BiLSTMTagger
from lexiflow.models.seq2seq.rnn import RNNSeq2SeqConfig
from lexiflow.models.seq2seq.translator import TokenizerConfig, Translator
from lexiflow.models.tokenizers.wordpiece import WordPiece

from tests.test_finetune import EWT, _texts
from tests.test_lm_neural import BOS, TRAIN, VALID, V, quick, small_rnn, small_transformer
from tests.test_neural_tagger import WORD_SENTS, lookahead_corpus, tiny, train_cfg
from tests.test_train_loop import PlantedTask, snapshot

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.mark.parametrize("make", [
    lambda: RNNLM(RNNConfig(V, cell="lstm", emb_dim=32, hidden_dim=32, num_layers=1, dropout=0.0, tie_weights=True),
                  quick(epochs=4, lr=3e-2, batch_size=4, device="cuda")),
    lambda: TransformerLM(small_transformer(positional="learned"),
                          quick(epochs=4, lr=1e-2, bptt=24, batch_size=4, device="cuda")),
])
def test_an_lm_trains_on_cuda_to_the_cpu_bar_and_its_saved_copy_scores_alike(tmp_path, make):
    lm = make().fit(TRAIN, VALID)
    assert next(lm.module_.parameters()).device.type == "cuda"
    assert lm.perplexity(VALID) < 6.0  # test_learns_the_successor_language's bar (unigram: ~30)
    probs = np.exp(lm.log_probs([BOS, 5, 6]))
    assert abs(probs.sum() - 1.0) < 1e-3 and probs.argmax() == 7  # next = previous + 1
    lm.save(tmp_path)
    back = registry.load(tmp_path)
    assert back.perplexity(VALID) == pytest.approx(lm.perplexity(VALID), rel=2e-2)  # bf16 either side


def test_glove_trains_on_cuda_like_on_the_cpu():
    # A random symmetric count matrix: the same seed on both devices; CUDA adds atomically, so the runs
    # agree to rounding, not bit for bit.
    counts = sp.random(300, 300, density=0.05, random_state=0, data_rvs=lambda n: np.ceil(np.random.default_rng(0)
                                                                                           .pareto(1.5, n) + 1))
    counts = sp.csr_matrix(counts + counts.T)
    cuda = GloVe(dim=16, epochs=8, batch_size=1024, device="cuda", seed=0).fit(counts)
    cpu = GloVe(dim=16, epochs=8, batch_size=1024, device="cpu", seed=0).fit(counts)
    losses = [h["loss"] for h in cuda.history_]
    assert losses[-1] < 0.8 * losses[0] and np.isfinite(cuda.vectors_).all()  # CPU: 1.09 -> 0.76
    assert losses[-1] == pytest.approx(cpu.history_[-1]["loss"], rel=0.05)


# ---- the models on the shared trainer (models/lm/train.py): the translator, the BiLSTM tagger with ELMo,
# fine-tuning with LoRA. Each trains on `cuda` (bf16 autocast) to its CPU test's bar; a model saved there
# loads on the CPU and agrees with it (both fp32 at inference, so only rounding may flip a near tie).


def test_translator_trains_on_cuda_and_its_saved_copy_translates_alike_on_cuda_and_the_cpu(shared_data, tmp_path):
    lines = (shared_data / "tatoeba-eng-fra" / "train.tsv").read_text(encoding="utf-8").splitlines()[:300]
    src, tgt = (list(side) for side in zip(*(line.split("\t") for line in lines), strict=True))
    tr = Translator("rnn", RNNSeq2SeqConfig(0, 0, emb_dim=16, hidden_dim=16, attention="additive", dropout=0.1),
                    TokenizerConfig("word", 500),
                    TrainConfig(epochs=2, batch_size=32, lr=3e-3, clip_grad_norm=1.0, device="cuda"))
    tr.fit(src, tgt, valid=(src[:40], tgt[:40]))
    assert tr.device_.type == "cuda"
    assert tr.history_[-1]["valid_loss"] < tr.history_[0]["train_loss"]  # test_seq2seq's bar
    [run] = tr.translate(["Run!"], return_attention=True)
    np.testing.assert_allclose(run.attention.sum(1), 1.0, rtol=1e-4)
    tr.save(tmp_path / "m")
    on_cuda, on_cpu = Translator.load(tmp_path / "m", device="cuda"), Translator.load(tmp_path / "m", device="cpu")
    assert on_cuda.translate(src[:20], beam_width=3) == tr.translate(src[:20], beam_width=3)
    gpu, cpu = tr.translate(src[:20], beam_width=3, n_best=2), on_cpu.translate(src[:20], beam_width=3, n_best=2)
    assert sum(g[0].target_tokens == c[0].target_tokens for g, c in zip(gpu, cpu, strict=True)) >= 18
    # cuDNN's RNNs may round in TF32
    assert [g[0].score for g in gpu] == pytest.approx([c[0].score for c in cpu], rel=1e-2)


def test_bilstm_tagger_with_elmo_trains_on_cuda_to_the_cpu_bar_and_tags_alike_on_the_cpu(tmp_path):
    on_cuda = train_cfg(epochs=12, lr=2e-2, device="cuda")
    bilm = BiLM(BiLMConfig(dim=6, hidden_dim=10, num_layers=2, char_dim=4, char_filters=3, char_kernels=(1, 2),
                           min_count=1, train=train_cfg(device="cuda"))).fit(WORD_SENTS)
    tagger = BiLSTMTagger(tiny(elmo=True, train=on_cuda, word_dropout_alpha=0.0)).fit(lookahead_corpus(200, 2),
                                                                                       bilm=bilm)
    assert next(tagger.module_.parameters()).device.type == "cuda"
    test = lookahead_corpus(40, 1)
    words, gold = [[w for w, _, _ in s] for s in test], [t for s in test for _, t, _ in s]
    tags = tagger.tag_many(words)
    assert np.mean(np.array([t for s in tags for t in s]) == np.array(gold)) > 0.97  # test_neural_tagger's bar
    tagger.save(tmp_path / "m")
    back = BiLSTMTagger.load(tmp_path / "m")  # on the CPU
    assert next(back.module_.parameters()).device.type == "cpu"
    assert np.mean(np.array([t for s in back.tag_many(words) for t in s]) == [t for s in tags for t in s]) > 0.99
    assert sum(back.elmo_weights()["weights"]) == pytest.approx(1.0)


def test_fine_tuning_with_lora_learns_upos_on_cuda_and_merging_keeps_its_outputs():
    """test_finetune's EWT task and bar (NOUN, the majority tag, is ~17 %), LoRA on a tiny encoder."""
    dev = EWT / "en_ewt-ud-dev.conllu"
    tok = WordPiece(vocab_size=800, special_tokens=BERT_SPECIALS).fit(_texts(dev))
    examples = ewt_examples(dev, tok, "upos", UPOS_TAGS, max_len=64)
    train, held = examples[:600], examples[600:800]
    torch.manual_seed(0)
    model = Classifier(EncoderModel(EncoderConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2,
                                                  d_ff=64, max_len=64)), "token", len(UPOS_TAGS))
    finetune(model, FineTuneConfig(mode="full"), train, held,
             TrainConfig(epochs=8, batch_size=16, lr=5e-3, warmup_steps=10, log_every_s=1e9, checkpoint_every=0,
                         clip_grad_norm=1.0, device="cuda"))
    assert next(model.parameters()).device.type == "cuda"
    assert accuracy(model, held) > 0.4  # where the model is (the fine-tuning stage calls it so on a GPU worker)
    lora = FineTuneConfig(mode="lora", lora_rank=4, lora_alpha=8, lora_max_share=1)
    metrics = finetune(model, lora, train, held, TrainConfig(epochs=2, batch_size=16, lr=5e-3, log_every_s=1e9,
                                                             checkpoint_every=0, device="cuda"))
    assert metrics["trainable"] < metrics["total"]
    ids = torch.tensor([held[0].ids], device="cuda")
    with torch.no_grad():
        before = model.eval()(ids)
        merge_lora(model)
        torch.testing.assert_close(model(ids), before, atol=1e-4, rtol=1e-4)


# ---- the loop at the hardware's speed (issue 44): no host sync per step, fused AdamW, TF32, skip on device


def _cuda_lm_trainer(**kw):
    cfg = quick(**{"bptt": 24, "batch_size": 4, "device": "cuda", "log_every_s": 1e9, **kw})
    torch.manual_seed(0)
    task = LMStreamTask(to_stream(TRAIN, BOS, 2, V), None, cfg, bos_id=BOS, pad_id=3, window=24)
    return Trainer(Transformer(small_transformer(positional="learned")), task, cfg), task.epoch_batches(0)


def test_a_cuda_training_step_never_waits_for_the_device():
    """torch's sync debug mode raises on any host-device synchronisation (.item(), a blocking copy, a boolean
    index); steps 2-4 of the Transformer LM and of the MLM (padded batches, chosen positions) run under it."""
    trainer, batches = _cuda_lm_trainer(max_nonfinite_steps=100)
    rng = np.random.default_rng(0)
    sents = [rng.integers(5, 30, size=rng.integers(3, 14)) for _ in range(64)]
    config = EncoderConfig(vocab_size=30, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=16)
    mlm_cfg = TrainConfig(epochs=1, batch_size=8, device="cuda", log_every_s=1e9, checkpoint_every=0,
                          max_nonfinite_steps=100)
    mlm_task = MLMTask(sents, None, config, mlm_cfg)
    mlm = Trainer(EncoderModel(config), mlm_task, mlm_cfg)
    for t, bs in ((trainer, batches), (mlm, mlm_task.epoch_batches(0))):
        t.step(bs[0])  # allocator, kernel choice
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for b in bs[1:4]:
                t.step(b)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert t.end_epoch()["skipped_steps"] == 0


def test_the_loop_uses_fused_adamw_and_tf32_on_cuda_and_restores_the_setting():
    trainer, batches = _cuda_lm_trainer(max_steps=3)
    assert trainer.opt.defaults["fused"]
    seen = []
    trainer.on_step = lambda step, loss: seen.append(torch.get_float32_matmul_precision())
    before = torch.get_float32_matmul_precision()
    trainer.run()
    assert seen == ["high"] * 3 and torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize("sparse_sgd", [False, True])
def test_a_planted_nan_is_skipped_on_cuda(sparse_sgd):
    plain_sgd = {"optimizer": "sgd", "lr": 0.5, "clip_grad_norm": None}
    trainer, batches = _cuda_lm_trainer(**(plain_sgd if sparse_sgd else {}))
    if sparse_sgd:  # the RNN LM's embedding takes sparse gradients: the gradients are zeroed on the device
        torch.manual_seed(0)
        trainer = Trainer(RNN(small_rnn()), trainer.task, trainer.cfg)
        assert trainer.sparse
    trainer.task = PlantedTask(trainer.task, bad={2})
    trainer.step(batches[0])
    before = snapshot(trainer)
    trainer.step(batches[1])
    after = snapshot(trainer)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0, msg=key)
    assert trainer.end_epoch()["skipped_steps"] == 1


@pytest.mark.parametrize("length", [64, 192])
def test_masked_bf16_attention_gives_finite_gradients_where_cudnns_kernel_gave_nan(length):
    """The bf16 MLM divergence's cause (pytorch/pytorch#196678): cuDNN's attention backward, with a mask, a length
    of 64 mod 128 and a row whose logsumexp is below ln(FLT_MAX) = -88.7, returned NaN query gradients. The shared
    attention's masked path keeps cuDNN out: finite gradients, equal to fp32 math's to bf16's precision."""
    torch.manual_seed(0)
    d = 64
    q = torch.randn(1, 1, length, d, device="cuda") * 0.1
    k = torch.randn(1, 1, length, d, device="cuda") * 0.1
    v = torch.randn(1, 1, length, d, device="cuda")
    q[..., 0], k[..., 0] = 1.0, -120 * d**0.5  # every logit ~ -120
    mask = torch.ones(1, 1, 1, length, dtype=torch.bool, device="cuda")
    mask[..., length - 5:] = False  # key padding, as the encoder's batches have
    grad = torch.randn(1, 1, length, d, device="cuda")
    grads = []
    for dtype in (torch.bfloat16, torch.float32):
        leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        _fused_attention(*leaves, mask, 0.0).backward(grad.to(dtype))
        grads.append([t.grad.float() for t in leaves])
    for low, high in zip(*grads, strict=True):
        assert torch.isfinite(low).all()
        torch.testing.assert_close(low, high, atol=0.05, rtol=0.05)
