"""models.bleu: the notes' worked example, and sacreBLEU's numbers on random and real text."""

import math
import random

import pytest
from lexiflow.models.bleu import corpus_bleu, corpus_chrf, tokenize_13a
from lexiflow.models.errors import ParameterError

sacrebleu = pytest.importorskip("sacrebleu")



@pytest.fixture(scope="module")
def tatoeba_dev(shared_data) -> list[tuple[str, str]]:
    lines = (shared_data / "tatoeba-eng-fra" / "dev.tsv").read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines]


NOTES_CANDIDATE = "the cat the cat on the mat"
NOTES_REFS = ["the cat is on the mat", "there is a cat on the mat"]


def test_notes_worked_example_004_modified_precisions():
    # 004: candidate bigrams {the cat x2, cat the, cat on, on the, the mat}: clipped matches 4 of 6.
    # Unigrams: the x3 (clipped to 2), cat x2 (to 1), on, mat: 5 of 7. Trigrams: "cat on the", "on the mat"
    # of 5. 4-grams: "cat on the mat" of 4. c = 7, closest reference length 7: BP = 1.
    b = corpus_bleu([NOTES_CANDIDATE], [[NOTES_REFS[0]], [NOTES_REFS[1]]])
    assert b.counts == [5, 4, 2, 1] and b.totals == [7, 6, 5, 4]
    assert b.precisions[1] == pytest.approx(100 * 4 / 6)
    assert b.bp == 1.0 and b.sys_len == 7 and b.ref_len == 7
    expected = 100 * math.exp((math.log(5 / 7) + math.log(4 / 6) + math.log(2 / 5) + math.log(1 / 4)) / 4)
    assert b.score == pytest.approx(expected, abs=1e-9)
    assert b.score == pytest.approx(sacrebleu.corpus_bleu([NOTES_CANDIDATE], [[NOTES_REFS[0]], [NOTES_REFS[1]]]).score,
                                    abs=1e-6)


def test_brevity_penalty_of_a_short_candidate():
    b = corpus_bleu(["the cat"], [["the cat is on the mat"]])  # c = 2 < r = 6
    assert b.bp == pytest.approx(math.exp(1 - 6 / 2))
    assert b.totals[2] == 0 and b.precisions[2] == 0.0 and b.score == 0.0  # no trigram at all: BLEU-4 is 0
    assert b.score == sacrebleu.corpus_bleu(["the cat"], [["the cat is on the mat"]]).score


def _random_sentence(rng: random.Random, vocab: list[str]) -> str:
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 12)))


def test_equals_sacrebleu_on_random_text_with_punctuation_and_several_references():
    rng = random.Random(0)
    vocab = ["the", "cat", "sat", "on", "mat", "a", "dog", ".", ",", "3.5", "1,000", "don't", "-", "5-6", "(x)",
             "&amp;", "Été", "l'homme", "!", "?", "\"q\"", "e-mail", "a.b", "<skipped>"]
    for trial in range(30):
        n = rng.randint(1, 40)
        hyps = [_random_sentence(rng, vocab) for _ in range(n)]
        n_refs = rng.randint(1, 3)
        refs = [[_random_sentence(rng, vocab) for _ in range(n)] for _ in range(n_refs)]
        if trial % 3 == 0 and n_refs > 1:
            refs[1][0] = None  # a segment with fewer references
        ours = corpus_bleu(hyps, refs)
        theirs = sacrebleu.corpus_bleu(hyps, refs)
        assert ours.score == pytest.approx(theirs.score, abs=1e-6), (hyps, refs)
        assert ours.precisions == pytest.approx(theirs.precisions, abs=1e-6)
        assert (ours.bp, ours.sys_len, ours.ref_len) == (pytest.approx(theirs.bp), theirs.sys_len, theirs.ref_len)
        assert corpus_chrf(hyps, refs) == pytest.approx(sacrebleu.corpus_chrf(hyps, refs).score, abs=1e-6)


def test_equals_sacrebleu_on_tatoeba_french_with_word_dropout_as_system_output(tatoeba_dev):
    # a "system" that drops and swaps words of the reference: realistic, partial n-gram overlap
    rng = random.Random(1)
    refs = [tgt for _, tgt in tatoeba_dev[:500]]
    hyps = []
    for r in refs:
        words = [w for w in r.split() if rng.random() > 0.2]
        if len(words) > 2 and rng.random() < 0.3:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        hyps.append(" ".join(words))
    ours, theirs = corpus_bleu(hyps, [refs]), sacrebleu.corpus_bleu(hyps, [refs])
    assert ours.score == pytest.approx(theirs.score, abs=1e-6)
    assert 10 < ours.score < 90
    assert corpus_chrf(hyps, [refs]) == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-6)


def test_13a_tokenizer_equals_sacrebleu():
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    for s in ["Hello, world.", "It costs $3.50, or 1,000 yen!", "l'homme -- « bonjour »", "5-6 e-mail a.b",
              "&quot;x&quot; &amp; y", "trailing-\nline"]:
        assert tokenize_13a(s) == tok(s)


def test_identical_and_disjoint_and_bad_arguments():
    assert corpus_bleu(["a b c d e"], [["a b c d e"]]).score == pytest.approx(100.0)
    assert corpus_bleu(["x y z"], [["a b c"]]).score == 0.0
    with pytest.raises(ParameterError, match=r"references\[0\] has 1 segments, hypotheses have 2"):
        corpus_bleu(["a", "b"], [["a"]])
    with pytest.raises(ParameterError, match="reference streams"):
        corpus_bleu(["a"], ["a"])
