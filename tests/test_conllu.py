import pytest
from lexiflow.models.conllu import format_sentence, parse_lines, read_conllu
from lexiflow.models.errors import InputError

SAMPLE = """# sent_id = s1
# text = I can't go.
1\tI\tI\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\tcan't\t_\t_\t_\t_\t_\t_\t_\t_
2\tca\tcan\tAUX\tMD\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t_\t_
4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_parse_skips_multiword_and_empty_nodes():
    sents = list(parse_lines(SAMPLE.splitlines(), "x.conllu"))
    assert [s.words for s in sents] == [["I", "ca", "n't", "go", "."], ["Hi"]]
    assert sents[0].upos == ["PRON", "AUX", "PART", "VERB", "PUNCT"]
    assert sents[0].xpos == ["PRP", "MD", "RB", "VB", "."]
    assert sents[0].sent_id == "s1" and sents[0].text == "I can't go."
    assert sents[1].line == 11


def test_round_trip_through_format():
    sents = list(parse_lines(SAMPLE.splitlines()))
    again = list(parse_lines("".join(format_sentence(s) for s in sents).splitlines()))
    assert [(s.words, s.upos, s.xpos) for s in again] == [(s.words, s.upos, s.xpos) for s in sents]


@pytest.mark.parametrize(
    "bad, message",
    [("1\tI\tI\tPRON\n", "bad.conllu:1: expected 10 tab-separated"),
     ("x\tI\tI\tPRON\tPRP\t_\t0\troot\t_\t_\n", "bad.conllu:1: token ID 'x'")],
)
def test_malformed_line_names_file_and_line(bad, message):
    with pytest.raises(InputError, match=message):
        list(parse_lines(bad.splitlines(), "bad.conllu"))


def test_reads_real_ewt(shared_data):
    sents = list(read_conllu(shared_data / "ud-english-ewt" / "en_ewt-ud-dev.conllu"))
    assert len(sents) == 2001
    assert all(len(s.words) == len(s.upos) == len(s.xpos) for s in sents)


def test_byte_order_mark_is_skipped(tmp_path):
    # Editors on Windows save UTF-8 with a BOM; ingestion already accepts such files, so tagging must too.
    path = tmp_path / "bom.conllu"
    path.write_bytes("\ufeff".encode() + SAMPLE.encode())
    assert [s.words for s in read_conllu(path)] == [s.words for s in parse_lines(SAMPLE.splitlines())]


def test_tagged_corpus_version_follows_only_the_conllu_sources_and_the_settings_it_reads(tmp_path):
    from lexiflow.tasks.corpus import ingest_tagged
    from lexiflow.tasks.params import CorpusParams

    treebank, text = tmp_path / "a-train.conllu", tmp_path / "b.txt"
    treebank.write_text("1\tThe\tthe\tDET\tDT\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    text.write_text("plain text\n", encoding="utf-8")

    def version(*sources, **settings):
        return ingest_tagged.version_of({"store": str(tmp_path), "params": CorpusParams(
            sources=[str(s) for s in sources], **settings)})

    base = version(treebank)
    assert version(treebank, lowercase=False) == base
    assert version(treebank, dedupe=False, split_sentences=False, text_unit="file") == base
    assert version(treebank, text) == base  # a plain-text source is no input of the tagged corpus
    assert version(treebank, valid_fraction=0.2) != base  # decides the split of sentences without a file split
    treebank.write_text("1\tA\ta\tDET\tDT\t_\t0\troot\t_\t_\n\n", encoding="utf-8")
    assert version(treebank) != base
