"""BPE and WordPiece: hand-derived merges (ties included), a textbook full-recount oracle, Hugging
Face as an oracle (BpeTrainer merges, tokenizer.json encodings), round trips."""

from __future__ import annotations

import json
import random
from collections import Counter

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lexiflow.models import tokenizers
from lexiflow.models.errors import InputError, ParameterError
from lexiflow.models.text import WORD_CHARS, pretokenize
from lexiflow.models.tokenizers import BPE, WordPiece
from lexiflow.models.vocab import Vocabulary
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from tests.conftest import WIKITEXT_VALID

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# Jurafsky & Martin, SLP3 ch. 2: the BPE exercise corpus
SLP3 = ["low"] * 5 + ["lowest"] * 2 + ["newer"] * 6 + ["wider"] * 3 + ["new"] * 2


@pytest.fixture(scope="module")
def wiki_lines(shared_data) -> list[str]:
    return WIKITEXT_VALID.read_text(encoding="utf-8").splitlines()


# ---- hand-derived merges ----------------------------------------------------------------------
def test_bpe_separate_marker_slp3_by_hand():
    # ids: specials 0-3, then </w> d e i l n o r s t w (as strings, `<` < `d`) = 4..14.
    # (e,r)=9 ties (r,</w>)=9 -> smaller left id e; (e,w)=8 ties (n,e)=8 -> e(6) < n(9);
    # at count 3, (w,i) (i,d) (d,er</w>) tie -> d has the smallest id, then i, then w.
    bpe = BPE(vocab_size=1000, marker="separate").fit(SLP3)
    assert bpe.merges_[:12] == [
        ("e", "r"), ("er", "</w>"), ("e", "w"), ("n", "ew"), ("l", "o"), ("lo", "w"), ("new", "er</w>"),
        ("low", "</w>"), ("d", "er</w>"), ("i", "der</w>"), ("w", "ider</w>"), ("e", "s"),
    ]
    assert bpe.merge_counts_[:12] == [9, 9, 8, 8, 7, 7, 6, 5, 3, 3, 3, 2]
    assert bpe.vocab_[:15] == SPECIALS + ["</w>", *"deilnorstw"]
    assert bpe.tokenize("newer lower") == ["newer</w>", "low", "er</w>"]


def test_bpe_glued_marker_slp3_by_hand_and_hf_agrees():
    # ids: specials, d e i l n o r s t w = 4..13, then suffixed r</w> t</w> w</w> = 14..16.
    # (e,r</w>)=9; (n,e)=8 alone (e,w is split between w and w</w>); (l,o)=7; (ne,w)=6 ties (w,er</w>)=6 -> w < ne.
    bpe = BPE(vocab_size=1000, marker="glued").fit(SLP3)
    expected = [("e", "r</w>"), ("n", "e"), ("l", "o"), ("w", "er</w>"), ("ne", "wer</w>"), ("lo", "w</w>"),
                ("d", "er</w>"), ("i", "der</w>"), ("w", "ider</w>"), ("e", "s")]
    assert bpe.merges_[:10] == expected
    assert bpe.vocab_[14:17] == ["r</w>", "t</w>", "w</w>"]
    assert _hf_bpe_merges(SLP3, 1000, min_frequency=2)[:10] == expected


def test_bpe_marker_string_is_configurable():
    bpe = BPE(vocab_size=1000, marker="glued", end_of_word="_").fit(SLP3)
    assert bpe.merges_[0] == ("e", "r_")
    assert bpe.tokenize("newer") == ["newer_"]
    assert bpe.decode(bpe.encode("newer low")) == "newer low"


UNDERSCORED = ["my_var is my_var and my_var", "my cat my dog", "__init__ snake_case _x y_ a_b_c"] * 3


@pytest.mark.parametrize("marker", ["separate", "glued"])
@pytest.mark.parametrize("vocab_size", [10, 30, 60])  # no merges, some, many
def test_words_with_underscores_round_trip_with_the_default_marker(marker, vocab_size):
    """`_` is a word character: as the marker (the old default) it made `my_var` decode as `my var`
    and, glued, the merge `y _` the same token as a word-final `y`."""
    bpe = BPE(vocab_size=vocab_size, marker=marker, min_frequency=1).fit(UNDERSCORED)
    for text in [*UNDERSCORED, "my_var", "my_", "_my", "y_ y", "a_b_c __init__"]:
        assert bpe.decode(bpe.encode(text)) == text
    assert bpe.encode("my_") != bpe.encode("my")
    if marker == "glued":  # and the exported tokenizer.json (end_of_word_suffix) agrees
        hf = Tokenizer.from_str(bpe.to_hf_json())
        assert hf.encode("my_var y_ __init__").tokens == bpe.tokenize("my_var y_ __init__")
        assert hf.decode(hf.encode("my_var y_ __init__").ids) == "my_var y_ __init__"


def test_the_pipeline_uses_the_same_default_marker():
    from lexiflow.tasks.params import TokenizerParams

    assert TokenizerParams().end_of_word == BPE().end_of_word == "</w>"


def test_an_underscore_marker_keeps_its_documented_caveat():
    bpe = BPE(vocab_size=10, marker="glued", end_of_word="_").fit(UNDERSCORED)  # no merges
    assert bpe.tokenize("my_var") == ["m", "y", "_", "v", "a", "r_"]
    assert bpe.decode(bpe.encode("my_var")) == "my var"  # an inner `_` reads as a word end


def test_wordpiece_score_by_hand_with_ties():
    # units: h p b ##u ##g ##n ##s with counts 15 17 4 36 20 16 5.
    # step 1: (##g,##s) scores 5/(20*5)=1/20, every other pair 1/36 (raw frequency would pick ##u ##g = 20).
    # step 2: six pairs tie at 1/36 -> smallest (left,right) ids: ##u(7) with ##g(4).
    # step 3: (##u,##n), (b,##u), (##u,##gs) tie at 1/21 -> (##u=7, ##n=5).
    corpus = ["hug"] * 10 + ["pug"] * 5 + ["pun"] * 12 + ["bun"] * 4 + ["hugs"] * 5
    wp = WordPiece(vocab_size=4 + 7 + 3).fit(corpus)
    assert wp.vocab_ == SPECIALS + ["##g", "##n", "##s", "##u", "b", "h", "p", "##gs", "##ug", "##un"]
    assert wp.merges_ == [("##g", "##s"), ("##u", "##g"), ("##u", "##n")]
    assert wp.merge_scores_ == pytest.approx([1 / 20, 1 / 36, 1 / 21], rel=1e-15)
    assert wp.merge_counts_ == [5, 15, 16]
    assert wp.tokenize("hugs bun") == ["h", "##ug", "##s", "b", "##un"]  # longest match first
    assert wp.tokenize("hugz") == ["<unk>"]  # a word that cannot be covered is unknown as a whole


def test_wordpiece_differs_from_hf_wordpiece_trainer():
    corpus = ["hug"] * 10 + ["pug"] * 5 + ["pun"] * 12 + ["bun"] * 4 + ["hugs"] * 5
    tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # HF's initial vocabulary here: 4 specials, 7 plain characters, 4 ## units; one merge more
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=16, special_tokens=SPECIALS,
                                                              show_progress=False))
    hf_vocab = tok.get_vocab()
    assert max(hf_vocab, key=hf_vocab.get) == "##ug"  # HF merges by raw frequency (20)
    ours = WordPiece(vocab_size=12).fit(corpus)
    assert ours.merges_ == [("##g", "##s")]  # the likelihood score picks the rarer, more associated pair


# ---- a textbook full-recount oracle on random corpora ----------------------------------------
def _naive_bpe(words: Counter, marker: str, eow: str, vocab_size: int, min_frequency: int) -> list[tuple[str, str]]:
    """Textbook BPE: recount every pair after every merge; ties by (left id, right id) as documented."""
    chars = sorted({c for w in words for c in w} | ({eow} if marker == "separate" else set()))
    strings = SPECIALS + chars
    if marker == "glued":
        strings += sorted({w[-1] + eow for w in words})
    ids = {s: i for i, s in enumerate(strings)}
    segs = {w: (list(w) + [eow] if marker == "separate" else list(w[:-1]) + [w[-1] + eow]) for w in words}
    merges = []
    while len(ids) < vocab_size:
        pairs: Counter = Counter()
        for w, seg in segs.items():
            for x, y in zip(seg, seg[1:], strict=False):
                pairs[x, y] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], ids[p[0]], ids[p[1]]))
        if pairs[best] < min_frequency:
            break
        merges.append(best)
        new = best[0] + best[1]
        ids.setdefault(new, len(ids))
        _apply_merge(segs, best, new)
    return merges


def _naive_wordpiece(words: Counter, vocab_size: int) -> list[tuple[str, str]]:
    units = sorted({w[0] for w in words} | {"##" + c for w in words for c in w[1:]})
    ids = {s: i for i, s in enumerate(SPECIALS + units)}
    segs = {w: [w[0]] + ["##" + c for c in w[1:]] for w in words}
    merges = []
    while len(ids) < vocab_size:
        pairs: Counter = Counter()
        unit: Counter = Counter()
        for w, seg in segs.items():
            for u in seg:
                unit[u] += words[w]
            for x, y in zip(seg, seg[1:], strict=False):
                pairs[x, y] += words[w]
        cands = [p for p in pairs if pairs[p] >= 2]
        if not cands:
            break
        best = min(cands, key=lambda p: (-pairs[p] / (unit[p[0]] * unit[p[1]]), ids[p[0]], ids[p[1]]))
        merges.append(best)
        new = best[0] + best[1].removeprefix("##")
        ids.setdefault(new, len(ids))
        _apply_merge(segs, best, new)
    return merges


def _apply_merge(segs: dict[str, list[str]], pair: tuple[str, str], new: str) -> None:
    """Replace every non-overlapping occurrence of `pair`, left to right, in each word's segments."""
    for w, seg in segs.items():
        out, j = [], 0
        while j < len(seg):
            if j + 1 < len(seg) and (seg[j], seg[j + 1]) == pair:
                out.append(new)
                j += 2
            else:
                out.append(seg[j])
                j += 1
        segs[w] = out


def _random_corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    # a tiny alphabet makes repeated symbols (aaa), overlapping pairs and count ties common
    types = ["".join(rng.choice("abcab") for _ in range(rng.randint(1, 7))) for _ in range(40)]
    return [" ".join(rng.choice(types) for _ in range(rng.randint(1, 12))) for _ in range(60)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("marker", ["separate", "glued"])
def test_incremental_bpe_equals_full_recount(seed, marker):
    texts = _random_corpus(seed)
    words = Counter(w for t in texts for w in t.split())
    ours = BPE(vocab_size=60, marker=marker, min_frequency=2).fit(texts)
    assert ours.merges_ == _naive_bpe(words, marker, "</w>", 60, 2)
    # the training segmentation (cache) is exactly what encoding from scratch gives
    for w in words:
        ids = list(ours._cache[w])
        ours._cache.pop(w)
        assert ours.encode(w) == ids


@pytest.mark.parametrize("seed", range(6))
def test_incremental_wordpiece_equals_full_recount(seed):
    texts = _random_corpus(100 + seed)
    words = Counter(w for t in texts for w in t.split())
    assert WordPiece(vocab_size=60).fit(texts).merges_ == _naive_wordpiece(words, 60)


# ---- Hugging Face as the oracle on WikiText-2 -------------------------------------------------
def _hf_bpe_merges(texts: list[str], vocab_size: int, min_frequency: int) -> list[tuple[str, str]]:
    tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, end_of_word_suffix="</w>",
                                  min_frequency=min_frequency, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return [tuple(m) for m in json.loads(tok.to_str())["model"]["merges"]]


def test_bpe_glued_first_1000_merges_equal_hf_bpe_trainer(wiki_lines):
    ours = BPE(vocab_size=1400, marker="glued", pretokenizer="whitespace", min_frequency=2).fit(wiki_lines)
    hf = _hf_bpe_merges(wiki_lines, 1400, 2)
    assert len(ours.merges_) >= 1000
    assert ours.merges_[:1000] == hf[:1000]


@pytest.mark.parametrize("make", [lambda: BPE(vocab_size=3000, marker="glued"), lambda: WordPiece(vocab_size=3000)])
def test_tokenizer_json_encodes_wikitext_identically(wiki_lines, make):
    # trained on a third of the file, so the rest has unseen words (and characters) to cover
    ours = make().fit(wiki_lines[: len(wiki_lines) // 3])
    hf = Tokenizer.from_str(ours.to_hf_json())
    mine = ours.encode_batch(pl.Series(wiki_lines)).to_list()
    theirs = [e.ids for e in hf.encode_batch(wiki_lines)]
    assert sum(map(len, mine)) > 200_000
    assert mine == theirs
    assert hf.decode(theirs[3]) == ours.decode(mine[3]) == ours.normalize(wiki_lines[3])


def _words(pre_tokenizer, text: str) -> list[str]:
    return [w for w, _ in pre_tokenizer.pre_tokenize_str(text)]


def test_the_exported_pre_tokenizer_splits_words_as_ours():
    """tokenizer.json runs WORD_PATTERN in Oniguruma, ours in Rust regex (polars). With `\\w` they
    disagreed on the zero-width (non-)joiners (Persian) and Latin-1's superscripts and fractions."""
    hf = Tokenizer.from_str(BPE(vocab_size=30, marker="glued").fit(["x"]).to_hf_json()).pre_tokenizer
    for text, words in [("می\u200cخواهم", ["می\u200cخواهم"]), ("e=mc² x¹ ½", ["e", "=", "mc", "²", "x", "¹", "½"]),
                        ("👩\u200d💻", ["👩", "\u200d", "💻"])]:
        assert pretokenize(text) == _words(hf, text) == words
    bmp = [chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
    for text in (" ".join(f"a{c}b" for c in bmp),  # each character between letters: a word character?
                 " ".join(f"1.{c}" for c in bmp)):  # after a number: a digit?
        assert pretokenize(text) == _words(hf, text)


def test_the_character_classes_of_the_word_pattern_agree_on_every_code_point():
    """Maximal runs of each class over all code points in order: equal runs mean each code point is
    in the class for both engines or for neither (every code point occurs once, so a run fixes its place)."""
    everything = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for cls in (WORD_CHARS, r"\p{Nd}", r"\s"):
        runs = f"[{cls}]+"
        hf = pre_tokenizers.Split(Regex(runs), behavior="removed", invert=True)
        assert pl.Series([everything]).str.extract_all(runs)[0].to_list() == _words(hf, everything), cls


# ---- round trips, corpus encoding, specials --------------------------------------------------
_TEXT = st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)), max_size=60)  # ## is reserved


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_TEXT, marker=st.sampled_from(["separate", "glued", "wordpiece"]))
def test_decode_encode_is_normalize(text, marker):
    # every character seen in training (the UNK policy maps unseen ones to <unk>, which is lossy)
    tok = WordPiece(vocab_size=40) if marker == "wordpiece" else BPE(vocab_size=40, marker=marker)
    tok.fit(["low lower newest", text])
    assert tok.decode(tok.encode(text)) == tok.normalize(text)
    assert tok.tokenize(text) == [tok.id_to_token(i) for i in tok.encode(text)]


def test_normalize_is_nfc_and_word_pretokenization():
    bpe = BPE(vocab_size=50, marker="separate").fit(["x"])
    assert bpe.normalize("Cafe\u0301  don't\n\tstop-me, 3.14!") == "Caf\u00e9 don't stop-me , 3.14 !"
    assert BPE(vocab_size=50, marker="separate", pretokenizer="whitespace").fit(["x"]).normalize(" a,b  c ") == "a,b c"


@pytest.mark.parametrize("make", [lambda: BPE(vocab_size=400, marker="glued"),
                                  lambda: BPE(vocab_size=400, marker="separate"),
                                  lambda: WordPiece(vocab_size=400)])
def test_save_load_round_trips_exactly(tmp_path, wiki_lines, make):
    ours = make().fit(wiki_lines[:300])
    ours.save(tmp_path)
    files = {"vocab.parquet", "merges.parquet", "config.json"}
    if getattr(ours, "marker", "glued") == "glued":  # `separate` has no HF equivalent
        files.add("tokenizer.json")
    assert {p.name for p in tmp_path.iterdir()} == files
    back = type(ours).load(tmp_path)
    assert back.get_params() == ours.get_params()
    assert back.vocab_ == ours.vocab_ and back.merges_ == ours.merges_
    assert back.merge_counts_ == ours.merge_counts_ and back.merge_scores_ == ours.merge_scores_
    assert back.vocab_frame().equals(ours.vocab_frame()) and back.merges_frame().equals(ours.merges_frame())
    sample = pl.Series(wiki_lines[300:600])
    assert back.encode_batch(sample).to_list() == ours.encode_batch(sample).to_list()
    merges = pl.read_parquet(tmp_path / "merges.parquet")
    assert merges.columns == ["rank", "left", "right", "count", "score"]
    assert pl.read_parquet(tmp_path / "vocab.parquet").columns == ["id", "token", "count"]


def test_encode_batch_matches_per_text_encoding():
    texts = ["low lower", "", None, "newest newer low", "zzz"]
    bpe = BPE(vocab_size=60, marker="separate").fit(SLP3)
    out = bpe.encode_batch(pl.Series(texts))
    assert out.dtype == pl.List(pl.UInt32)
    assert out.to_list() == [bpe.encode(t or "") for t in texts]
    assert out[4].to_list() == [bpe.unk_id] * 3 + [bpe.token_to_id("</w>")]  # unseen characters -> <unk>


def word_vocabulary(texts: list[str]) -> Vocabulary:
    return Vocabulary.count(pl.Series("w", [pretokenize(t) for t in texts]))


@pytest.mark.parametrize("kind", ["word", "bpe", "wordpiece"])
def test_one_interface_for_the_three_tokenizer_kinds(tmp_path, wiki_lines, kind):
    """encode(text) -> ids, decode, tokenize, token_to_id / id_to_token, the special ids, encode_batch
    (texts or pre-tokenized words) and tokenizers.load: the same contract for every kind."""
    train = wiki_lines[:200]
    tok = {"word": lambda: word_vocabulary(train), "bpe": lambda: BPE(vocab_size=300, marker="separate").fit(train),
           "wordpiece": lambda: WordPiece(vocab_size=300).fit(train)}[kind]()
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2, 3)
    assert [tok.id_to_token(i) for i in range(4)] == SPECIALS
    assert [tok.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3] and tok.token_to_id("no such token") is None
    texts = [line for line in train[:60] if line.strip() and "<unk>" not in line]  # WikiText writes <unk> literally
    for text in texts:
        ids = tok.encode(text)
        assert ids and all(type(i) is int and 0 <= i < len(tok) for i in ids)
        assert tok.unk_id not in ids  # every word (word), every character (subwords) was seen in training
        assert tok.decode(ids) == " ".join(pretokenize(text))  # the text as the tokenizer sees it
        assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == tok.decode(ids)
        assert tok.tokenize(text) == [tok.id_to_token(i) for i in ids]
        assert [tok.token_to_id(t) for t in tok.tokenize(text)] == ids
    batch = tok.encode_batch(texts)
    assert batch.dtype == pl.List(pl.UInt32) and batch.to_list() == [tok.encode(t) for t in texts]
    assert tok.encode_batch(pl.Series(texts)).to_list() == batch.to_list()
    words = [pretokenize(t) for t in texts] + [[]]
    assert tok.encode_batch(words, is_pretokenized=True).to_list() == batch.to_list() + [[]]
    unseen = "жжж"  # one word of a letter no training text has
    assert tok.encode(unseen) == ([tok.unk_id] * 3 + [tok.token_to_id("</w>")] if kind == "bpe" else [tok.unk_id])
    if kind == "word":  # the stage writes a word vocabulary's files itself
        tok.frame.write_parquet(tmp_path / "vocab.parquet")
        (tmp_path / "config.json").write_text(json.dumps({"kind": "word"}))
    else:
        tok.save(tmp_path)
    back = tokenizers.load(tmp_path)
    assert type(back) is type(tok) and len(back) == len(tok)
    assert back.encode_batch(wiki_lines[200:400]).to_list() == tok.encode_batch(wiki_lines[200:400]).to_list()


def test_loading_a_folder_that_is_no_tokenizer_names_it(tmp_path):
    with pytest.raises(InputError, match="config.json: cannot read the tokenizer config"):
        tokenizers.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"kind": "sentencepiece"}))
    with pytest.raises(InputError, match="unknown tokenizer kind 'sentencepiece'; known: word, bpe, wordpiece"):
        tokenizers.load(tmp_path)


@pytest.mark.parametrize("make", [lambda: BPE(vocab_size=60, marker="glued"),
                                  lambda: BPE(vocab_size=60, marker="separate"), lambda: WordPiece(vocab_size=60)])
def test_an_empty_word_encodes_to_no_tokens(make):
    tok = make().fit(SLP3)
    assert tok.encode_words(["", "low", ""]) == [[], tok.encode("low"), []]


def test_vocab_counts_are_token_frequencies_of_the_segmented_corpus():
    bpe = BPE(vocab_size=1000, marker="glued").fit(SLP3)
    counts = dict(zip(bpe.vocab_frame()["token"], bpe.vocab_frame()["count"], strict=True))
    assert counts["newer</w>"] == 6 and counts["low</w>"] == 5 and counts["<unk>"] == 0


def test_special_tokens_and_unk():
    bpe = BPE(vocab_size=60, marker="separate").fit(SLP3)
    assert (bpe.unk_id, bpe.bos_id, bpe.eos_id, bpe.pad_id) == (0, 1, 2, 3)
    assert bpe.vocab_[:4] == SPECIALS
    assert bpe.decode([1, *bpe.encode("low"), 2, 3]) == "low"
    wp = WordPiece(vocab_size=60, unk_token="[UNK]").fit(SLP3)
    assert wp.vocab_[:4] == ["[UNK]", "<s>", "</s>", "<pad>"] and wp.unk_id == 0
    assert wp.tokenize("low qq") == ["low", "[UNK]"]
    wp2 = WordPiece(vocab_size=60, special_tokens=("[PAD]", "[UNK]"), unk_token="[UNK]").fit(SLP3)
    assert wp2.unk_id == 1 and wp2.tokenize("q") == ["[UNK]"]


def test_parameter_and_input_errors():
    with pytest.raises(ParameterError, match="marker"):
        BPE(marker="middle").fit(SLP3)
    with pytest.raises(ParameterError, match="vocab_size"):
        WordPiece(vocab_size=3).fit(SLP3)
    with pytest.raises(ParameterError, match="pretokenizer"):
        BPE(pretokenizer="bytes").fit(SLP3)
    with pytest.raises(InputError, match="no words"):
        BPE().fit(["", "   "])
    with pytest.raises(ParameterError, match="not fitted"):
        BPE().tokenize("x")
    with pytest.raises(ParameterError, match="separate"):
        BPE(vocab_size=60, marker="separate").fit(SLP3).to_hf_json()


def test_a_corpus_of_one_character_words_fits_without_merges():
    """Found by fuzzing (tests/test_fuzz.py): with no adjacent pair at all (one-character words and
    the glued marker, or WordPiece) the pair counting indexed an empty array and raised IndexError."""
    for tok in (BPE(vocab_size=10, marker="glued"), WordPiece(vocab_size=10)):
        tok.fit(["a b a", "0"])
        assert tok.merges_ == [] and tok.decode(tok.encode("b a 0")) == "b a 0"
    bpe = BPE(vocab_size=10, marker="glued").fit(["a b a", "0"])
    assert bpe.vocab_[4:] == ["0", "a", "b", "0</w>", "a</w>", "b</w>"] and bpe.tokenize("a b") == ["a</w>", "b</w>"]
