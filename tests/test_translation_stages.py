"""The translation stages end to end on a small store: parallel_corpus -> seq2seq -> report, lexiflow.loaders.load and
`lexiflow translate`."""

from __future__ import annotations

import json

import pytest
from lexiflow.flows.cli import main as cli
from lexiflow.flows.params import validate
from lexiflow.loaders import load
from lexiflow.models.bleu import corpus_bleu
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.storage import ArtifactStore, Catalog
from lexiflow.tasks.params import Seq2SeqParams, TranslationCorpusParams
from lexiflow.tasks.report import _translation_section
from lexiflow.tasks.translation import _references, ingest_parallel, train_seq2seq

from tests.stages import publish

TINY = dict(emb_dim=16, hidden_dim=16, epochs=2, batch_size=32, lr=3e-3, warmup_steps=0, device="cpu",
            beam_width=3, vocab_size=600)


@pytest.fixture(scope="module")
def store(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("t")
    lines = (shared_data / "tatoeba-eng-fra" / "train.tsv").read_text(encoding="utf-8").splitlines()
    data = root / "data"
    data.mkdir()
    (data / "train.tsv").write_text("\n".join(lines[:400]) + "\n", encoding="utf-8")
    (data / "dev.tsv").write_text("\n".join(lines[400:440]) + "\n", encoding="utf-8")
    (data / "test.tsv").write_text("\n".join(lines[440:480]) + "\n", encoding="utf-8")
    s = ArtifactStore(str(root / "store"))
    pairs = publish(s, ingest_parallel, params=TranslationCorpusParams(sources=[str(data)]))
    model = publish(s, train_seq2seq, pairs=pairs, model="rnn", params=Seq2SeqParams(**TINY))
    return s, pairs, model, data


def test_parallel_corpus_and_seq2seq_manifests(store):
    s, pairs, model, _ = store
    m = s.manifest("parallel_corpus", pairs.version)["metrics"]
    assert m["per_split"] == {"train": 400 - m["duplicates"], "valid": 40, "test": 40} and m["skipped_lines"] == 0
    metrics = s.manifest("seq2seq", model.version)["metrics"]
    assert metrics["model"] == "rnn" and metrics["train_pairs"] == m["per_split"]["train"]
    # the manifest's test BLEU is corpus BLEU of the model's beam output against all references of each source
    tr = load(s, "seq2seq", model.version)
    test = load(s, "parallel_corpus", pairs.version).filter(split="test")
    sources, refs = _references(test["source"].to_list(), test["target"].to_list())
    assert metrics["test_bleu"] == pytest.approx(corpus_bleu(tr.translate(sources, beam_width=3), refs).score)
    names = {f["name"] for f in s.manifest("seq2seq", model.version)["files"]}
    assert {"model.safetensors", "config.json", "src-vocab.parquet", "tgt-vocab.parquet", "samples.json",
            "attention-0.png"} <= names
    samples = json.loads(s.read_text("seq2seq", model.version, "samples.json"))
    assert samples[0]["references"] and isinstance(samples[0]["translation"], str)


def test_report_section_and_loader(store, tmp_path):
    s, _, model, _ = store
    tr = load(s, "seq2seq")
    out = tr.translate(["Run!", "Wow!"], beam_width=2, return_attention=True)
    assert out[0].attention.shape[1] == len(out[0].source_tokens)

    class Out:  # the report's writer, enough for the section: PNG copies land in tmp_path
        def path(self, name):
            return tmp_path / name

    lines = _translation_section(Out(), [model])
    text = "\n".join(lines)
    assert "## Translation" in text and "| rnn |" in text and "![seq2seq-rnn-attention-0.png]" in text
    assert (tmp_path / "seq2seq-rnn-attention-0.png").read_bytes().startswith(b"\x89PNG")


def test_cli_translate_writes_whole_output(store, tmp_path, capsys):
    s, _, model, data = store
    src = tmp_path / "in.txt"
    src.write_text("Run!\nWow!\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert cli(["translate", str(src), "-o", str(out), "--beam", "2", "--store", s.url, "--model", model.version]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == load(s, "seq2seq").translate(["Run!", "Wow!"],
                                                                                              beam_width=2)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\n")
    assert cli(["translate", str(bad), "-o", str(tmp_path / "o2.txt"), "--store", s.url]) == 2
    assert "bad.txt:2: invalid UTF-8" in capsys.readouterr().err
    assert not (tmp_path / "o2.txt").exists()


def test_cli_translate_with_the_released_model(store, tmp_path, capsys):
    s, _, model, _ = store
    Catalog(s).release("seq2seq", model.version)
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("Run!\nWow!\n", encoding="utf-8")
    released = ["--store", s.url, "--model", "seq2seq@production"]
    assert cli(["translate", str(src), "-o", str(out), "--beam", "2", *released]) == 0
    assert out.read_text(encoding="utf-8").splitlines() == load(s, "seq2seq", model.version).translate(
        ["Run!", "Wow!"], beam_width=2)
    for alias, error in (("seq2seq@staging", "no alias 'staging' for seq2seq in "),
                         ("seq2seq@", "'seq2seq@' is not an alias reference: write KIND@NAME")):
        assert cli(["translate", str(src), "--store", s.url, "--model", alias]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {error}")


def test_bad_parallel_input_and_parameters(tmp_path):
    f = tmp_path / "x.tsv"
    f.write_text("a\tb\nno tab\n", encoding="utf-8")
    s = ArtifactStore(str(tmp_path / "store"))
    with pytest.raises(InputError, match=r"x.tsv:2: no tab"):
        publish(s, ingest_parallel, params=TranslationCorpusParams(sources=[str(f)]))
    assert Catalog(s).kinds() == []  # nothing published
    with pytest.raises(ParameterError, match="seq2seq.n_heads=3 does not divide"):
        validate({"translation": {"sources": [str(f)]}, "seq2seq": {"models": ["transformer"], "n_heads": 3}})


def test_seq2seq_section_derives_from_the_model_configs():
    from lexiflow.models.seq2seq.rnn import RNNSeq2SeqConfig
    from lexiflow.models.seq2seq.transformer import TransformerSeq2SeqConfig
    from lexiflow.models.seq2seq.translator import TokenizerConfig
    from lexiflow.tasks.translation import make_translator

    p = Seq2SeqParams()
    assert (p.hidden_dim, p.attention, p.d_model, p.norm, p.tokenizer) == (
        RNNSeq2SeqConfig().hidden_dim, RNNSeq2SeqConfig().attention, TransformerSeq2SeqConfig().d_model,
        TransformerSeq2SeqConfig().norm, TokenizerConfig().tokenizer)
    tr = make_translator("transformer", Seq2SeqParams(d_model=32, n_heads=2, norm="post", epochs=3,
                                                      joint_vocabulary=True), "ckpt")
    assert (tr.config.d_model, tr.config.norm, tr.train.epochs, tr.train.checkpoint_dir) == (32, "post", 3, "ckpt")
    assert tr.tokenizer.joint_vocabulary
    with pytest.raises(ParameterError, match="attention='cosine'"):
        RNNSeq2SeqConfig(10, 10, attention="cosine").validate()
