"""models.parallel: the formats, split handling and bad parallel input."""

import gzip
import json

import polars as pl
import pytest
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.parallel import ParallelOptions, read_parallel


def test_tatoeba_split_files_keep_their_split(shared_data):
    c = read_parallel([str(shared_data / "tatoeba-eng-fra")])
    per = c.stats["per_split"]
    # the files hold 64,595 / 3,965 / 3,854 lines; a few pairs are equal after normalisation (e.g. NBSP)
    assert 64_000 < per["train"] <= 64_595 and 3_900 < per["valid"] <= 3_965 and 3_800 < per["test"] <= 3_854
    assert c.stats["ignored_files"][0].endswith("ATTRIBUTION.txt")
    src, tgt = c.split("valid")
    assert (src[0], tgt[0]) == ("I fell.", "Je suis tombée.")
    assert set(c.pairs.filter(pl.col("split") == "test")["source_file"].to_list()) == \
        {str(shared_data / "tatoeba-eng-fra" / "test.tsv")}


def test_formats_agree_and_unsplit_files_split_by_source_hash(tmp_path):
    pairs = [(f"sentence number {i} .", f"phrase numéro {i} .") for i in range(300)]
    pairs += [("sentence number 7 .", "autre traduction 7 .")]  # a second translation of one source
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "corpus.tsv").write_text("".join(f"{s}\t{t}\tattribution\n" for s, t in pairs))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "corpus.en").write_text("".join(f"{s}\n" for s, _ in pairs))
    with gzip.open(tmp_path / "b" / "corpus.fr.gz", "wt", encoding="utf-8") as f:
        f.write("".join(f"{t}\n" for _, t in pairs))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "corpus.jsonl").write_text("".join(json.dumps({"en": s, "fr": t}) + "\n" for s, t in pairs))
    (tmp_path / "d").mkdir()
    pl.DataFrame({"en": [s for s, _ in pairs], "fr": [t for _, t in pairs]}).write_parquet(tmp_path / "d" / "c.parquet")
    o = ParallelOptions(source_lang="en", target_lang="fr", source_field="en", target_field="fr", valid_fraction=0.2,
                        test_fraction=0.2)
    got = {d: read_parallel([str(tmp_path / d)], o).pairs.select("source", "target", "split") for d in "abcd"}
    for d in "bcd":
        assert got[d].equals(got["a"]), d
    a = got["a"]
    assert a.height == 301
    assert 20 < (a["split"] == "test").sum() < 100 and 20 < (a["split"] == "valid").sum() < 100
    assert a.filter(pl.col("source") == "sentence number 7 .")["split"].n_unique() == 1  # both translations


def test_bad_lines_name_file_and_line_or_are_skipped_and_counted(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_bytes(b"good one\tbon un\nno tab here\nempty target\t \n\xff\xfe bad\tmauvais\ngood two\tbon deux\n")
    with pytest.raises(InputError, match=r"train.tsv:4: invalid UTF-8.*bad_files='skip'"):  # decoding comes first
        read_parallel([str(f)])
    f.write_bytes(f.read_bytes().replace(b"\xff\xfe", b"ok"))
    with pytest.raises(InputError, match=r"train.tsv:2: no tab between source and target.*bad_files='skip'"):
        read_parallel([str(f)])
    f.write_bytes(f.read_bytes().replace(b"ok bad", b"\xff\xfe bad"))
    c = read_parallel([str(f)], ParallelOptions(bad_files="skip"))
    assert c.pairs["source"].to_list() == ["good one", "good two"]
    assert c.stats["skipped_lines"] == 3
    assert c.stats["skipped_examples"][2].endswith("train.tsv:3: empty target side")
    assert "train.tsv:4: invalid UTF-8" in c.stats["skipped_examples"][0]  # found while decoding, first
    g = tmp_path / "x.tsv"
    g.write_text("a\tb\n\tonly target\n")
    with pytest.raises(InputError, match=r"x.tsv:2: empty source side"):
        read_parallel([str(g)])


def test_aligned_files_of_different_lengths_or_without_partner(tmp_path):
    (tmp_path / "t.en").write_text("a\nb\n")
    (tmp_path / "t.fr").write_text("a\n")
    o = ParallelOptions(source_lang="en", target_lang="fr")
    with pytest.raises(InputError, match=r"t.en has 2 lines but .*t.fr has 1"):
        read_parallel([str(tmp_path / "t.en"), str(tmp_path / "t.fr")], o)
    with pytest.raises(InputError, match=r"t.en: its aligned partner .*t.fr is missing"):
        read_parallel([str(tmp_path / "t.en")], o)
    j = tmp_path / "bad.jsonl"
    j.write_text('{"source": "a", "target": "b"}\n{"source": "a"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: no fields 'source' and 'target'"):
        read_parallel([str(j)])
    with pytest.raises(InputError, match="no parallel data"):
        read_parallel([str(tmp_path / "t.en")], ParallelOptions(source_lang="de", target_lang="it"))
    with pytest.raises(ParameterError, match="bad_files"):
        ParallelOptions(bad_files="ignore")
