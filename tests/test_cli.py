"""The command line and the pipeline parameter form, without running the pipeline."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from lexiflow.flows.cli import main
from lexiflow.flows.params import validate
from lexiflow.models.errors import ParameterError
from lexiflow.storage import Catalog

from tests.stages import publish


@pytest.fixture
def no_pipeline(monkeypatch):
    """`lexiflow run` must stop before the pipeline starts."""
    def fail(_params):
        raise AssertionError("the pipeline started")
    monkeypatch.setattr("lexiflow.flows.pipeline.run_pipeline", fail)


@pytest.mark.parametrize("settings, message", [
    (['lm=["lstm"]', "neural.pretrained=glove"], "neural.pretrained=glove: not among embeddings (svd, sgns)"),
    (['lm=["lstm"]', "neural.pretrained=svd"],
     "neural.pretrained=svd: its vectors have svd.dim=300 dimensions, the lstm LM needs neural.emb_dim=128"),
    (['lm=["transformer"]', 'embeddings=["glove"]', "neural.pretrained=glove", "glove.dim=64"],
     "the transformer LM needs neural.d_model=128"),
    (['lm=["transformer"]', "neural.n_heads=3"], "neural.n_heads=3 does not divide neural.d_model=128"),
    (['lm=["gru"]', "neural.hidden_dim=64"], "neural.tie_weights=true needs neural.hidden_dim == neural.emb_dim"),
    (["tokenizer.kind=bpe", "tokenizer.end_of_word=end word"], "tokenizer.end_of_word: String should match pattern"),
    (["tokenizer.kind=bpe", "tokenizer.end_of_word=\x1f"], "tokenizer.end_of_word: String should match pattern"),
    (["ngram.order=1"], "ngram.order=1 with ngram.smoothing=kneser_ney: Kneser-Ney needs ngram.order >= 2"),
    (['lm=["gru"]', "neural.world_size=3"], "neural.batch_size=20 is not divisible by neural.world_size=3"),
    (['tagger.kinds=["hmm","bilstm"]', "tagger.pretrained=glove"],
     "tagger.pretrained=glove: not among embeddings (svd, sgns)"),
])
def test_run_rejects_combinations_that_cannot_work_before_any_stage(tmp_path, capsys, no_pipeline, settings,
                                                                     message):
    store = tmp_path / "store"
    args = ["run", "--store", str(store), "--corpus", "builtin:lee"]
    assert main([*args, *(x for s in settings for x in ("--set", s))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: invalid pipeline parameters: ") and message in err[0], err
    assert Catalog(store).list() == []


def test_combinations_that_work_are_accepted():
    validate({"lm": ["ngram"], "neural": {"pretrained": "glove"}})  # no neural LM: pretrained has nothing to do
    validate({"lm": ["lstm", "transformer"], "embeddings": ["sgns"], "word2vec": {"dim": 128},
              "neural": {"pretrained": "sgns"}})
    validate({"lm": ["transformer"], "neural": {"n_heads": 8, "hidden_dim": 64}})  # tying concerns RNNs only
    validate({"lm": ["rnn"], "neural": {"hidden_dim": 64, "tie_weights": False}})
    validate({"lm": ["ngram"], "ngram": {"order": 1, "smoothing": "add_k"}})  # a unigram model needs no KN
    validate({"lm": ["gru"], "ngram": {"order": 1}})  # no n-gram model trained
    validate({"lm": ["ngram"], "neural": {"world_size": 3}})  # no neural model trained


def test_a_deployed_pipeline_run_checks_the_combinations_before_any_stage(tmp_path):
    from lexiflow.flows.pipeline import pipeline
    from lexiflow.tasks.params import CorpusParams, NeuralLMParams

    missing = CorpusParams(sources=[str(tmp_path / "missing.txt")])  # the first stage would fail on it
    with pytest.raises(ParameterError, match="neural.pretrained=glove: not among embeddings"):
        pipeline.fn(store=str(tmp_path), corpus=missing, lm=["lstm"], neural=NeuralLMParams(pretrained="glove"))
    assert Catalog(tmp_path).list() == []


def test_run_on_a_store_path_through_a_file_fails_at_once_with_one_line(tmp_path, capsys, no_pipeline):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    assert main(["run", "--store", str(blocker / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: store {blocker / 'store'}: cannot create its folder ({blocker} is a file, not a folder); "
                   f"choose another store path"]


@pytest.mark.parametrize("name, content, message", [
    ("c.json", b"[1]", 'expected an object of parameter sections, e.g. {"svd": {"dim": 200}}, found [1]'),
    ("c.json", b"3", "found 3"),
    ("c.toml", b"[svd]\ndim = 200 # caf\xe9\n", "not UTF-8 text (byte 21); save it as UTF-8"),
    ("c.toml", b"[svd\n", "not valid TOML"),
])
def test_run_rejects_a_config_file_it_cannot_use_naming_it(tmp_path, capsys, no_pipeline, name, content, message):
    config = tmp_path / name
    config.write_bytes(content)
    assert main(["run", "--store", str(tmp_path / "store"), "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --config {config}: ") and message in err[0], err


def test_training_flows_name_the_input_version_the_store_lacks(tmp_path):
    from lexiflow.flows.training import LM_TRAINERS, _resolve_inputs

    missing = "0" * 16
    with pytest.raises(ParameterError, match=f"inputs.tokens: no artifact tokenized_corpus:{missing} in {tmp_path}"):
        _resolve_inputs(LM_TRAINERS["ngram"], str(tmp_path), {"tokens": missing, "tokenizer": missing})
    with pytest.raises(ParameterError, match="inputs.tokens: invalid artifact version 'abc'"):
        _resolve_inputs(LM_TRAINERS["ngram"], str(tmp_path), {"tokens": "abc"})


TAGGED = [[("the", "DET", "DT"), ("cat", "NOUN", "NN"), ("sat", "VERB", "VBD")],
          [("a", "DET", "DT"), ("dog", "NOUN", "NN"), ("ran", "VERB", "VBD")]]
UPOS, XPOS = {"DET", "NOUN", "VERB"}, {"DT", "NN", "VBD"}
UPOS_TAGGER, XPOS_TAGGER = "a" * 16, "b" * 16


def publish_tagger(store, column, version, suffix=""):
    """A small HMM tagger of one tag set (its tags + `suffix`), recorded as the tagger stage records it."""
    from lexiflow.models.hmm import HMMTagger

    index = {"upos": 1, "xpos": 2}[column]
    train = [[(word[0], word[index] + suffix) for word in sentence] for sentence in TAGGED]
    with store.writer("tagger", version, parameters={"column": column}) as out:
        HMMTagger(order=2).fit(train * 5).save(out.folder)
        out.metrics["column"] = column


@pytest.fixture
def quiet_logs():
    """Errors only from lexiflow's loggers (no progress lines): standard error holds what the CLI prints."""
    logger = logging.getLogger("lexiflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def tagger_store(tmp_path, quiet_logs):
    """A store with the two taggers the pipeline trains, UPOS then XPOS."""
    from lexiflow.storage import ArtifactStore

    store = ArtifactStore(tmp_path / "store")
    publish_tagger(store, "upos", UPOS_TAGGER)
    publish_tagger(store, "xpos", XPOS_TAGGER)
    return store


def token_rows(text):
    return [line.split("\t") for line in text.splitlines() if line and line[0].isdigit()]


def one_error_line(capsys):
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), out.err
    return err[0].removeprefix("error: ")


def test_tag_plain_text_with_one_tagger_leaves_the_other_tag_set_blank(tmp_path, capsys, tagger_store):
    source = tmp_path / "text.txt"
    source.write_text("the cat sat. a dog ran.", encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", UPOS_TAGGER]) == 0
    rows = token_rows(capsys.readouterr().out)
    assert [r[1] for r in rows] == ["the", "cat", "sat", ".", "a", "dog", "ran", "."]
    assert {r[3] for r in rows} <= UPOS and {r[4] for r in rows} == {"_"}


def test_tag_plain_text_keeps_each_line_a_document_as_ingestion_does(tmp_path, capsys, tagger_store):
    source = tmp_path / "lines.txt"  # one sentence per line, no final punctuation, CRLF, a blank line
    source.write_bytes(b"the cat sat\r\n\r\na dog ran\r\nthe dog sat. The cat ran\ra cat sat")  # and an old Mac CR
    assert main(["tag", str(source), "--store", tagger_store.url]) == 0
    out = capsys.readouterr().out
    texts = [line.removeprefix("# text = ") for line in out.splitlines() if line.startswith("# text = ")]
    assert texts == ["the cat sat", "a dog ran", "the dog sat .", "The cat ran", "a cat sat"]
    assert [r[0] for r in token_rows(out)] == ["1", "2", "3"] * 2 + ["1", "2", "3", "4"] + ["1", "2", "3"] * 2


def test_tag_uses_the_latest_tagger_of_each_tag_set_by_default(tmp_path, capsys, tagger_store):
    publish_tagger(tagger_store, "upos", "c" * 16, suffix="-new")  # now the latest tagger of all, and of UPOS
    source = tmp_path / "text.txt"
    source.write_text("the cat sat. a dog ran.", encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url]) == 0
    rows = token_rows(capsys.readouterr().out)
    assert len(rows) == 8 and {r[3] for r in rows} <= {t + "-new" for t in UPOS} and {r[4] for r in rows} <= XPOS


def test_tag_refuses_two_taggers_of_one_tag_set(tmp_path, capsys, tagger_store):
    publish_tagger(tagger_store, "upos", "c" * 16)
    source = tmp_path / "text.txt"
    source.write_text("the cat sat.", encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", UPOS_TAGGER, "c" * 16]) == 2
    assert one_error_line(capsys) == f"--tagger {UPOS_TAGGER} {'c' * 16}: both predict upos; give one tagger " \
                                     "per tag set"


CONLLU = ("# sent_id = s1\n"
          "1\tthe\tthe\tGOLD\tGOLD\t_\t2\tdet\t_\t_\n"
          "2\tcat\tcat\tGOLD\tGOLD\t_\t0\troot\t_\t_\n"
          "2.1\tsat\tsit\tGOLD\tGOLD\t_\t_\t_\t2:dep\t_\n\n")


def test_tag_never_keeps_gold_tags_of_a_conllu_input_beside_predicted_ones(tmp_path, capsys, tagger_store):
    source = tmp_path / "gold.conllu"
    source.write_text(CONLLU, encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url, "--tagger", XPOS_TAGGER]) == 0
    out = capsys.readouterr().out
    xpos = [row[4] for row in token_rows(out)[:2]]
    assert set(xpos) <= XPOS  # predicted; UPOS, which no tagger given predicts, is blank, as are empty nodes
    assert out == ("# sent_id = s1\n"
                   f"1\tthe\tthe\t_\t{xpos[0]}\t_\t2\tdet\t_\t_\n"
                   f"2\tcat\tcat\t_\t{xpos[1]}\t_\t0\troot\t_\t_\n"
                   "2.1\tsat\tsit\t_\t_\t_\t_\t_\t2:dep\t_\n\n")
    assert main(["tag", str(source), "--store", tagger_store.url]) == 0  # default: both tag sets predicted
    rows = token_rows(capsys.readouterr().out)
    assert {r[3] for r in rows[:2]} <= UPOS and {r[4] for r in rows[:2]} <= XPOS and rows[2][3:5] == ["_", "_"]


def test_tag_reads_a_conllu_file_whatever_the_case_of_its_suffix(tmp_path, capsys, tagger_store):
    lower, upper = tmp_path / "gold.conllu", tmp_path / "GOLD.CONLLU"
    lower.write_text(CONLLU, encoding="utf-8")
    upper.write_text(CONLLU, encoding="utf-8")
    assert main(["tag", str(lower), "--store", tagger_store.url]) == 0
    tagged = capsys.readouterr().out
    assert main(["tag", str(upper), "--store", tagger_store.url]) == 0
    assert capsys.readouterr().out == tagged and "2.1\tsat\tsit\t_\t_" in tagged


@pytest.mark.parametrize("name, content", [("same.conllu", CONLLU), ("same.txt", "the cat sat.\n")])
def test_tag_refuses_to_write_over_its_input(tmp_path, capsys, tagger_store, name, content):
    source = tmp_path / name
    source.write_text(content, encoding="utf-8")
    (tmp_path / "sub").mkdir()
    same = tmp_path / "sub" / ".." / name  # another spelling of the same file
    before = sorted(tmp_path.iterdir())
    assert main(["tag", str(source), "-o", str(same), "--store", tagger_store.url]) == 2
    assert one_error_line(capsys) == f"-o {same}: is the input file; write the tagged file elsewhere"
    assert source.read_text(encoding="utf-8") == content and sorted(tmp_path.iterdir()) == before


def test_tag_writes_its_output_whole_or_not_at_all(tmp_path, capsys, tagger_store, monkeypatch):
    good, bad, output = tmp_path / "good.conllu", tmp_path / "bad.conllu", tmp_path / "out.conllu"
    good.write_text(CONLLU, encoding="utf-8")
    bad.write_text(CONLLU + "1\tbroken line\n", encoding="utf-8")
    assert main(["tag", str(good), "-o", str(output), "--store", tagger_store.url]) == 0
    assert main(["tag", str(good), "--store", tagger_store.url]) == 0
    assert output.read_text(encoding="utf-8") == capsys.readouterr().out  # the same as on standard output
    tagged, files = output.read_bytes(), sorted(tmp_path.iterdir())

    assert main(["tag", str(bad), "-o", str(output), "--store", tagger_store.url]) == 2  # bad input
    assert one_error_line(capsys).startswith(f"{bad}:6: expected 10 tab-separated CoNLL-U columns")
    assert main(["tag", str(bad), "-o", str(tmp_path / "new.conllu"), "--store", tagger_store.url]) == 2
    capsys.readouterr()
    assert output.read_bytes() == tagged and sorted(tmp_path.iterdir()) == files  # kept; no empty new.conllu

    def full_disk(lines, tags):  # the disk fills up after the first line
        yield "# sent_id = s1\n"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("lexiflow.models.conllu.replace_tags", full_disk)
    assert main(["tag", str(good), "-o", str(output), "--store", tagger_store.url]) == 2
    assert one_error_line(capsys) == f"-o {output}: cannot write it (No space left on device)"
    assert output.read_bytes() == tagged and sorted(tmp_path.iterdir()) == files  # no new, partial or temporary file


@pytest.mark.parametrize("name, content, output, message", [
    ("latin1.txt", b"the cat\ncaf\xe9 noir\n", None, "{input}:2: not UTF-8 text (byte 11); save the file as UTF-8"),
    ("latin1.conllu", CONLLU.encode() + b"1\tcaf\xe9\t_\t_\t_\t_\t0\troot\t_\t_\n",
     None, "{input}:6: not UTF-8 text (byte 122); save the file as UTF-8"),
    ("text.txt.gz", b"\x1f\x8b\x08\x00", None,
     "{input}: compressed; decompress it first (tag reads UTF-8 plain text or .conllu)"),
    ("folder", None, None, "{input}: is a folder; give a .conllu or plain-text file"),
    ("text.txt", b"the cat sat.\n", "missing/out.conllu",
     "-o {output}: its folder {tmp}/missing does not exist; create it or write elsewhere"),
    ("text.txt", b"the cat sat.\n", ".", "-o {output}: is a folder; give a file name, e.g. {output}/text.conllu"),
    ("bad.conllu", b"1\tthe\n", None,
     "{input}:1: expected 10 tab-separated CoNLL-U columns, found 2; fix the line or leave the file out"),
])
def test_tag_names_the_file_it_cannot_use_in_one_line(tmp_path, capsys, tagger_store, name, content, output,
                                                      message):
    source = tmp_path / name
    source.mkdir() if content is None else source.write_bytes(content)
    args = ["tag", str(source), "--store", tagger_store.url]
    if output:
        args += ["-o", str(tmp_path / output)]
    before = sorted(tmp_path.iterdir())
    assert main(args) == 2
    assert one_error_line(capsys) == message.format(input=source, output=tmp_path / (output or ""), tmp=tmp_path)
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_tag_with_a_damaged_tagger_artifact_says_so_in_one_line(tmp_path, capsys, tagger_store, damage):
    table = Path(tagger_store.path("tagger", UPOS_TAGGER)) / "emissions.parquet"
    table.unlink() if damage == "missing" else table.write_bytes(b"not parquet")
    source = tmp_path / "text.txt"
    source.write_text("the cat sat.", encoding="utf-8")
    assert main(["tag", str(source), "--store", tagger_store.url]) == 2
    why = "missing or not a plain file" if damage == "missing" else "checksum differs from the manifest"
    assert one_error_line(capsys) == (f"tagger:{UPOS_TAGGER}/emissions.parquet: {why}; remove it with "
                                      f"`lexiflow artifacts rm tagger:{UPOS_TAGGER} --force` and run again to "
                                      "rebuild it")  # found before the tagger reads it (SHA-256 of files read whole)


def publish_files(store, kind, version, **files):
    """An artifact holding text files (name=content), without a stage."""
    with store.writer(kind, version) as out:
        for name, content in files.items():
            out.write_text(name.replace("_", "."), content)
    return store.path(kind, version)


def test_export_of_an_artifact_missing_a_file_names_it_and_leaves_nothing(tmp_path, capsys):
    from lexiflow.storage import ArtifactStore

    store, version = ArtifactStore(tmp_path / "store"), "d" * 16
    folder = publish_files(store, "table", version, a_txt="a", b_txt="b")
    (Path(folder) / "b.txt").unlink()
    dest = tmp_path / "out" / "deep" / "dir"  # its missing parents are made, then removed again
    before = sorted(tmp_path.iterdir())
    assert main(["artifacts", "export", "table", str(dest), "--store", store.url]) == 2
    assert one_error_line(capsys) == (f"table:{version}/b.txt: listed in the manifest but missing from the store "
                                      f"{store.url}; run `lexiflow artifacts verify`")
    assert sorted(tmp_path.iterdir()) == before


def test_export_goes_into_a_new_or_empty_folder_only(tmp_path, capsys):
    from lexiflow.storage import ArtifactStore

    store, version = ArtifactStore(tmp_path / "store"), "d" * 16
    publish_files(store, "table", version, a_txt="a")
    full = tmp_path / "full"
    full.mkdir()
    (full / "manifest.json").write_text("another export's")
    assert main(["artifacts", "export", "table", str(full), "--store", store.url]) == 2
    assert one_error_line(capsys) == f"export destination {full} is not empty; choose a new or empty folder"
    assert [p.name for p in full.iterdir()] == ["manifest.json"]
    assert (full / "manifest.json").read_text() == "another export's"

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["artifacts", "export", f"table:{version}", str(empty), "--store", store.url]) == 0
    assert capsys.readouterr().out.split() == [str(empty / "a.txt"), str(empty / "manifest.json")]
    assert (empty / "a.txt").read_text() == "a" and sorted(p.name for p in empty.iterdir()) == ["a.txt",
                                                                                                 "manifest.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full", "store"]  # no temporary folder left

    (tmp_path / "afile").write_text("x")
    assert main(["artifacts", "export", "table", str(tmp_path / "afile" / "out"), "--store", store.url]) == 2
    assert one_error_line(capsys) == (f"export destination {tmp_path / 'afile' / 'out'}: cannot create it "
                                      f"({tmp_path / 'afile'} is a file, not a folder); choose another folder")


@pytest.mark.parametrize("command", [["artifacts", "list"], ["artifacts", "verify"], ["artifacts", "show", "lm"],
                                     ["artifacts", "export", "lm", "out"], ["generate", "--prompt", "the"],
                                     ["tag", "text.txt"]])
@pytest.mark.parametrize("store_is", ["missing", "a file"])
def test_read_only_commands_refuse_a_store_path_that_is_no_folder(tmp_path, capsys, monkeypatch, command, store_is):
    monkeypatch.chdir(tmp_path)
    Path("text.txt").write_text("the cat sat.")
    store = tmp_path / "typo"
    if store_is == "a file":
        store.write_text("not a store")
    assert main([*command, "--store", str(store)]) == 2
    why = "no such folder" if store_is == "missing" else "not a folder"
    assert one_error_line(capsys) == f"store {store}: {why}; give the store `lexiflow run` wrote, with --store or " \
                                     "LEXIFLOW_STORE"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"] + (["typo"] if store_is == "a file" else [])


@pytest.mark.parametrize("options, message", [
    (["--top-k", "5"], "--top-k applies to --strategy sample only; add --strategy sample or leave it out"),
    (["--temperature", "0.8"], "--temperature applies to --strategy sample only"),
    (["--strategy", "beam", "--top-p", "0.9"], "--top-p applies to --strategy sample only"),
    (["--seed", "3"], "--seed applies to --strategy sample only"),
    (["--strategy", "sample", "--width", "2"], "--width applies to --strategy beam only"),
])
def test_generate_rejects_options_of_another_strategy(tmp_path, capsys, options, message):
    assert main(["generate", "--prompt", "the", "--store", str(tmp_path), *options]) == 2
    assert one_error_line(capsys).startswith(message)


def test_generate_names_its_own_max_tokens_option(tmp_path, capsys):
    assert main(["generate", "--prompt", "the", "--store", str(tmp_path), "--max-tokens", "-1"]) == 2
    assert one_error_line(capsys) == "--max-tokens=-1: generate 0 tokens or more"  # not decoding's max_new_tokens


def test_a_reader_that_stops_early_ends_the_output_quietly(tmp_path):
    import subprocess
    import sys

    from lexiflow.storage import ArtifactStore

    store = ArtifactStore(tmp_path / "store")
    publish_files(store, "table", "d" * 16, a_txt="a")
    command = [sys.executable, "-m", "lexiflow.flows.cli", "artifacts", "show", "table", "--store", store.url]
    proc = subprocess.Popen(command, cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # as `| head` does once it has its lines
    err = proc.stderr.read().decode()
    assert (proc.wait(timeout=60), err) == (141, "")  # 128 + SIGPIPE, no traceback


def ngram_store(tmp_path):
    """A store with a trigram LM of a lowercased corpus of "The café sat on the mat number N." lines."""
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.lm import train_lm
    from lexiflow.tasks.params import CorpusParams, NgramParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    text = tmp_path / "docs.txt"
    text.write_text("\n".join(f"The café sat on the mat number {i % 5}." for i in range(200)))
    store = ArtifactStore(tmp_path / "store")
    corpus = publish(store, ingest_corpus, params=CorpusParams(sources=[str(text)]))  # lowercase=True
    words = publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=1))
    tokens = publish(store, encode_corpus, corpus=corpus, tokenizer=words)
    publish(store, train_lm, tokens=tokens, tokenizer=words, model="ngram", params=NgramParams(order=3))
    return store


def test_generate_cleans_and_lowercases_the_prompt_as_the_corpus_was(tmp_path, capsys):
    store = ngram_store(tmp_path)
    capsys.readouterr()
    prompt = "The\tCAFE\u0301"  # decomposed É: NFC, as ingestion does, makes it the corpus's é
    assert main(["generate", "--store", store.url, "--prompt", prompt, "--max-tokens", "2"]) == 0
    assert capsys.readouterr().out.strip() == "the café sat on"
    sample = ["--strategy", "sample", "--top-k", "1", "--temperature", "0.5", "--seed", "7"]  # top-1: greedy's tokens
    assert main(["generate", "--store", store.url, "--prompt", prompt, "--max-tokens", "2", *sample]) == 0
    assert capsys.readouterr().out.strip() == "the café sat on"


def test_generate_writes_no_special_token_where_unk_is_the_likeliest_word(tmp_path, capsys):
    """Most words after "the" occur once, below vocabulary.min_count: the model's likeliest next word is <unk>."""
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.lm import train_lm
    from lexiflow.tasks.params import CorpusParams, NgramParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    text = tmp_path / "docs.txt"
    text.write_text("\n".join([f"The w{i} ran." for i in range(40)] + ["The dog ran."] * 5))
    store = ArtifactStore(tmp_path / "store")
    corpus = publish(store, ingest_corpus, params=CorpusParams(sources=[str(text)], dedupe=False))
    words = publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=2))
    tokens = publish(store, encode_corpus, corpus=corpus, tokenizer=words)
    publish(store, train_lm, tokens=tokens, tokenizer=words, model="ngram", params=NgramParams(order=3))
    capsys.readouterr()
    command = ["generate", "--store", store.url, "--prompt", "the", "--max-tokens", "20"]
    assert main([*command, "--allow-unk"]) == 0
    assert capsys.readouterr().out.split()[1] == "<unk>"  # what the default prevents
    for options in ([], ["--strategy", "beam"], ["--strategy", "sample", "--temperature", "3", "--seed", "1"],
                    ["--no-repeat-ngram", "0"], ["--repetition-penalty", "1.5"]):
        assert main([*command, *options]) == 0
        out = capsys.readouterr().out.split()
        assert not {"<unk>", "<s>", "</s>", "<pad>"} & set(out), (options, out)
    assert main(command) == 0
    assert capsys.readouterr().out.strip() == "the dog ran ."


@pytest.mark.parametrize("options, message", [
    (["--repetition-penalty", "0"], "--repetition-penalty=0.0: use a number > 0"),
    (["--no-repeat-ngram", "-2"], "--no-repeat-ngram=-2: use 0 (off) or an n-gram size >= 1"),
])
def test_generate_names_its_repetition_options(tmp_path, capsys, options, message):
    assert main(["generate", "--prompt", "the", "--store", str(tmp_path), *options]) == 2
    assert one_error_line(capsys).startswith(message)


def test_lm_stage_refuses_tokens_encoded_with_another_tokenizer(tmp_path):
    """train-lm takes its inputs by version: tokens of one tokenizer with another tokenizer's vocabulary
    would silently train on the wrong words (and `generate` would decode with the wrong tokenizer)."""
    from lexiflow.storage import ArtifactStore
    from lexiflow.tasks.corpus import ingest_corpus
    from lexiflow.tasks.lm import train_lm
    from lexiflow.tasks.params import CorpusParams, NgramParams, VocabularyParams
    from lexiflow.tasks.vocabulary import encode_corpus, learn_vocabulary

    text = tmp_path / "docs.txt"
    text.write_text("\n".join(f"the cat sat on mat {i % 7} and dog {i % 3}." for i in range(100)))
    store = ArtifactStore(tmp_path / "store")
    corpus = publish(store, ingest_corpus, params=CorpusParams(sources=[str(text)]))
    words = publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=1))
    other = publish(store, learn_vocabulary, corpus=corpus, params=VocabularyParams(min_count=10))
    tokens = publish(store, encode_corpus, corpus=corpus, tokenizer=words)
    with pytest.raises(ParameterError, match=f"{tokens} was encoded with {words}, not {other}"):
        publish(store, train_lm, tokens=tokens, tokenizer=other, model="ngram", params=NgramParams(order=2))
    assert Catalog(store).list("lm") == []
    publish(store, train_lm, tokens=tokens, tokenizer=words, model="ngram", params=NgramParams(order=2))


@pytest.mark.parametrize("error, retried", [
    (NotADirectoryError(20, "Not a directory"), False), (PermissionError(13, "Permission denied"), False),
    (FileNotFoundError(2, "No such file"), False), (ParameterError("bad"), False),
    (TimeoutError("slow store"), True), (ConnectionResetError(104, "reset"), True), (OSError(5, "I/O error"), True),
])
def test_stages_retry_only_what_another_attempt_could_fix(error, retried):
    from lexiflow.tasks.stage import retry_transient_only

    class State:
        def result(self):
            raise error

    assert retry_transient_only(None, None, State()) is retried


def test_artifact_listings_are_strict_json_and_headlines_show_non_finite_figures(tmp_path, capsys):
    """Manifests hold null for NaN and "Infinity" for inf (docs/artifacts.md); one written before that
    convention (NaN, Infinity) is still listed as strict JSON."""
    import json

    from lexiflow.flows.commands.run import headline
    from lexiflow.storage import ArtifactStore

    from tests.test_store import strict

    store = ArtifactStore(tmp_path / "store")
    with store.writer("lm", "0" * 16) as out:
        out.write_json("config.json", {})
        out.metrics.update({"valid_perplexity": float("inf"), "test_perplexity": 12.5})
    old = {**store.manifest("lm", "0" * 16), "version": "1" * 16, "metrics": {"valid_perplexity": float("nan")}}
    (tmp_path / "store" / "lm" / ("1" * 16)).mkdir()
    (tmp_path / "store" / "lm" / ("1" * 16) / "manifest.json").write_text(json.dumps(old))
    for args in (["list", "--json"], ["show", "lm:" + "1" * 16], ["show", "lm:" + "0" * 16]):
        assert main(["artifacts", *args, "--store", str(store.root)]) == 0
        strict(capsys.readouterr().out)
    assert headline("lm", store.manifest("lm", "0" * 16)["metrics"]) == "valid_perplexity inf, test_perplexity 12.5"
    assert headline("evaluation", {"ws353_spearman": None, "simlex999_spearman": float("nan"),
                                   "analogy_add_accuracy": 0.5, "analogy_mul_accuracy": 0.25,
                                   "analogy_coverage": 1.0}) == (
        "ws353_spearman –, simlex999_spearman nan, analogy_add_accuracy 0.500, analogy_mul_accuracy 0.250, "
        "analogy_coverage 1.000")
    from lexiflow.tasks.report import _table
    from lexiflow.tasks.report_image import chart_png

    assert _table([{"valid_perplexity": "Infinity", "test_perplexity": None}], ("valid_perplexity", "test_perplexity"))[
        2] == "| inf | – |"
    assert chart_png([{"embeddings": "svd", "ws353_spearman": None, "analogy_add_accuracy": 0.5}])[:4] == b"\x89PNG"


@pytest.mark.parametrize("command, expected", [
    (["translate", "-"], "no seq2seq artifact in {store}; build one: lexiflow run --store {store} "
                         "--set 'translation.sources=[\"PAIRS.tsv\"]'"),
    (["tag", "text.txt"], "no tagger artifact in {store}; build one: lexiflow run --store {store} "
                          "--corpus TREEBANK.conllu"),
    (["generate", "--prompt", "the"], "no lm artifact in {store}; build one: lexiflow run --store {store}"),
    (["generate", "--prompt", "the", "--lm", "lstm"],
     "no lm artifact with model=lstm in {store}; build one: lexiflow run --store {store} --set 'lm=[\"lstm\"]'"),
    (["artifacts", "show", "embeddings:glove"], "no embeddings artifact with method=glove in {store}; build one: "
                                               "lexiflow run --store {store} --set 'embeddings=[\"glove\"]'"),
    (["artifacts", "export", "elmo", "out"], "no elmo artifact in {store}; build one: lexiflow run --store {store} "
                                             "--corpus TREEBANK.conllu --set 'tagger.kinds=[\"bilstm+elmo\"]'"),
    (["artifacts", "show", "lm:0123456789abcdef"],
     "no artifact lm:0123456789abcdef in {store}; `lexiflow artifacts list --kind lm --store {store}` shows the "
     "versions there, or build one: lexiflow run --store {store}"),
    (["artifacts", "show", "custom"], "no custom artifact in {store}; `lexiflow artifacts list --store {store}` "
                                      "shows what the store holds"),
])
def test_not_found_says_what_builds_the_artifact_in_one_line(tmp_path, capsys, monkeypatch, command, expected):
    monkeypatch.chdir(tmp_path)
    Path("text.txt").write_text("the cat sat.")
    store = tmp_path / "store"
    store.mkdir()
    assert main([*command, "--store", str(store)]) == 2
    assert one_error_line(capsys) == expected.format(store=store)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "text.txt"]  # nothing written


def test_the_loaders_say_what_builds_a_missing_artifact(tmp_path):
    from lexiflow.loaders import load
    from lexiflow.storage import StoreError

    with pytest.raises(StoreError, match=r"^no encoder artifact in .*; build one: lexiflow run --store .* "
                                         r"--corpus TREEBANK.conllu --set 'finetune.tasks=\[\"upos\"\]'$"):
        load(tmp_path, "encoder")


def test_every_next_step_is_a_run_that_builds_the_kind(tmp_path):
    """Each command of the table parses and validates, and asks for what builds the kind (or its tag)."""
    import shlex

    from lexiflow.flows.cli import build_parser
    from lexiflow.flows.commands.run import pipeline_params
    from lexiflow.loaders import LOADERS
    from lexiflow.storage.built_by import BUILT_BY, next_step
    from lexiflow.storage.formats import DISTINGUISHED_BY

    assert set(BUILT_BY) == set(LOADERS)  # every kind the pipeline makes
    tags = {"embeddings": "glove", "evaluation": "lsi", "tokenizer": "bpe", "lm": "lstm", "tagger": "xpos"}
    assert set(tags) == set(DISTINGUISHED_BY)
    for kind in BUILT_BY:
        for selector in ({}, {DISTINGUISHED_BY[kind]: tags[kind]} if kind in DISTINGUISHED_BY else {}):
            words = shlex.split(next_step(kind, str(tmp_path), selector).removeprefix("build one: lexiflow "))
            params = pipeline_params(build_parser().parse_args(words))
            assert params.store == str(tmp_path)
            if kind in ("tagged_corpus", "tagger", "elmo", "encoder", "finetuned"):
                assert params.corpus.sources == ["TREEBANK.conllu"]
            if kind in ("parallel_corpus", "seq2seq"):
                assert params.translation.sources == ["PAIRS.tsv"]
            if kind == "elmo":
                assert "bilstm+elmo" in params.tagger.kinds
            if kind in ("encoder", "finetuned"):
                assert params.finetune.tasks
            if selector:
                section = {"embeddings": params.embeddings, "evaluation": params.embeddings, "lm": params.lm,
                           "tokenizer": [params.tokenizer.kind], "tagger": params.tagger.columns}[kind]
                assert section == [tags[kind]], (kind, section)
