"""Subword tokenizers vs Hugging Face `tokenizers` (BpeTrainer, encode_batch) and sentencepiece BPE.

Corpora: the WikiText-2 validation text, and a >= 50 MB corpus generated from it with a heavy tail
of rare word types (each token is replaced, with probability 8%, by a synthetic word drawn from a
Zipf(1.1) law over 5M types made of a prefix of one real word and a suffix of another), so the
number of word types grows with size as in real text instead of staying at WikiText's 13k.

The 3x training target is judged twice on the big corpus: with lexiflow's word pre-tokenizer on
both sides (HF runs it through its Onig regex, which is slow), and with whitespace pre-tokenization
on both sides (HF's fast path, the ~5 CPU-second reference), where the CPU-seconds row is the fair one.

Every measurement runs in a fresh Python process: wall seconds, CPU seconds (all threads; HF and
sentencepiece use both cores) and that process's peak RSS. Same pre-tokenization for ours and HF
(lexiflow's word pattern, glued end-of-word marker); sentencepiece uses its own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import SHARED_DATA, Row

WIKITEXT = SHARED_DATA / "wikitext-2" / "wiki.valid.tokens"
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
SCRATCH = Path(tempfile.gettempdir()) / "lexiflow-bench-tokenizers"


def generate_corpus(target_mb: float, seed: int = 0) -> Path:
    """Write (once, cached) a heavy-tailed corpus of about `target_mb` MB built from WikiText-2."""
    path = SCRATCH / f"heavy_tail_{target_mb:g}mb_seed{seed}.txt"
    if path.exists():
        return path
    SCRATCH.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    base = WIKITEXT.read_text(encoding="utf-8").split()
    real = sorted({w for w in base if w.isalpha() and len(w) >= 4})
    n_tokens = int(target_mb * 1e6 / 5.3)  # about 5.3 bytes per token with its space
    tokens = np.array(base, dtype=object)[np.arange(n_tokens) % len(base)]
    replace = rng.random(n_tokens) < 0.08
    n_types = 5_000_000
    ranks = rng.zipf(1.1, size=int(replace.sum()))
    ranks = np.where(ranks > n_types, rng.integers(1, n_types, size=ranks.size), ranks)
    uniq, inverse = np.unique(ranks, return_inverse=True)
    left = rng.integers(0, len(real), size=n_types + 1)
    right = rng.integers(0, len(real), size=n_types + 1)
    cut = rng.integers(2, 5, size=n_types + 1)
    synth = np.array([real[left[r]][: cut[r]] + real[right[r]][cut[r] - 1:] for r in uniq.tolist()], dtype=object)
    tokens[np.flatnonzero(replace)] = synth[inverse]
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, n_tokens, 120):
            f.write(" ".join(tokens[start:start + 120].tolist()))
            f.write("\n")
    return path


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _ours_train(path: str, vocab: int, save_to: str, pre: str = "word") -> dict:
    from lexiflow.models.tokenizers import BPE

    lines = _lines(Path(path))
    t0, c0 = time.perf_counter(), time.process_time()
    bpe = BPE(vocab_size=vocab, marker="glued", pretokenizer=pre).fit(lines)
    out = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "merges": len(bpe.merges_)}
    bpe.save(save_to)
    return out


def _hf_train(path: str, vocab: int, save_to: str, pre: str = "word") -> dict:
    from lexiflow.models.text import WORD_PATTERN
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    lines = _lines(Path(path))
    tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = (pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="removed", invert=True)
                         if pre == "word" else pre_tokenizers.WhitespaceSplit())
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, end_of_word_suffix="</w>",
                                  min_frequency=2, show_progress=False)
    t0, c0 = time.perf_counter(), time.process_time()
    tok.train_from_iterator(lines, trainer)
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "merges": vocab}


def _spm_train(path: str, vocab: int, save_to: str) -> dict:
    import sentencepiece as spm

    t0, c0 = time.perf_counter(), time.process_time()
    spm.SentencePieceTrainer.train(
        input=path, model_prefix=str(Path(save_to) / "spm"), vocab_size=vocab, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, num_threads=2, minloglevel=2,
        input_sentence_size=0, max_sentence_length=16384,
    )
    # spm's trainer works in C++ threads of this process, so process_time covers it
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "merges": vocab}


def _ours_encode(path: str, tok_dir: str) -> dict:
    import polars as pl
    from lexiflow.models.tokenizers import BPE

    lines = pl.Series(_lines(Path(path)))
    bpe = BPE.load(tok_dir)  # cold: a freshly loaded tokenizer has no word cache
    t0, c0 = time.perf_counter(), time.process_time()
    ids = bpe.encode_batch(lines)
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0, "tokens": int(ids.list.len().sum())}


def _hf_encode(path: str, tok_dir: str) -> dict:
    from tokenizers import Tokenizer

    lines = _lines(Path(path))
    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    t0, c0 = time.perf_counter(), time.process_time()
    enc = tok.encode_batch(lines)
    out = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    out["tokens"] = sum(len(e.ids) for e in enc)
    return out


def _child_main() -> None:
    """Entry point of a measurement process: JSON [fn_name, args] in argv, JSON result on stdout."""
    fn_name, args = json.loads(sys.argv[1])
    result = globals()[fn_name](*args)
    result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


def measure(fn_name: str, *args: object) -> dict:
    """Run one measurement in a fresh process (clean peak memory, no shared caches)."""
    code = "from benchmarks.tokenizers import _child_main; _child_main()"
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([fn_name, list(args)])], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1], check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{fn_name}{args} failed: {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    corpora = {"WikiText-2 valid (1.1 MB)": WIKITEXT}
    if quick:
        SCRATCH.mkdir(parents=True, exist_ok=True)
        small = SCRATCH / "wikitext_first_1500_lines.txt"
        small.write_text("\n".join(_lines(WIKITEXT)[:1500]) + "\n", encoding="utf-8")
        corpora = {"WikiText-2 valid, first 1500 lines": small}
        vocabs = [1000]
    else:
        big = generate_corpus(55.0)
        corpora[f"heavy-tail corpus ({big.stat().st_size / 1e6:.0f} MB)"] = big
        vocabs = [8000, 32000]
    for name, path in corpora.items():
        for vocab in vocabs:
            case = f"{name}, vocab {vocab}"
            with tempfile.TemporaryDirectory() as ours_dir, tempfile.TemporaryDirectory() as spm_dir:
                ours = measure("_ours_train", str(path), vocab, ours_dir)
                hf = measure("_hf_train", str(path), vocab, ours_dir)
                sp = measure("_spm_train", str(path), vocab, spm_dir)
                big_corpus = "heavy-tail" in name
                target = "ratio <= 3" if big_corpus else ""
                for peer_name, peer in (("HF BpeTrainer", hf), ("sentencepiece BPE", sp)):
                    is_hf = peer_name.startswith("HF")
                    rows.append(Row("tokenizers", f"BPE train, {case}", "seconds (wall)", ours["wall"], peer["wall"],
                                    peer_name, higher_is_better=False, target=target if is_hf else "",
                                    met=(ours["wall"] / peer["wall"] <= 3) if (big_corpus and is_hf) else None,
                                    notes=f"{ours['merges']} merges; 2 cores; HF/spm multithreaded"))
                    rows.append(Row("tokenizers", f"BPE train, {case}", "CPU seconds", ours["cpu"], peer["cpu"],
                                    peer_name, higher_is_better=False))
                    rows.append(Row("tokenizers", f"BPE train, {case}", "peak RSS MB", ours["peak_mb"],
                                    peer["peak_mb"], peer_name, higher_is_better=False,
                                    notes="whole process incl. interpreter and corpus lines"))
                if vocab == vocabs[0]:
                    ours_enc = measure("_ours_encode", str(path), ours_dir)
                    hf_enc = measure("_hf_encode", str(path), ours_dir)
                    same = ours_enc["tokens"] == hf_enc["tokens"]
                    ours_rate = ours_enc["tokens"] / ours_enc["wall"]
                    hf_rate = hf_enc["tokens"] / hf_enc["wall"]
                    rows.append(Row("tokenizers", f"encode corpus, {case}", "tokens/s (wall)", ours_rate, hf_rate,
                                    "HF encode_batch", target="ratio >= 1", met=ours_rate >= hf_rate,
                                    notes=f"{ours_enc['tokens']} tokens; same count as HF: {same}; "
                                          "ours cold (loaded from disk), per word type + join"))
                    rows.append(Row("tokenizers", f"encode corpus, {case}", "peak RSS MB", ours_enc["peak_mb"],
                                    hf_enc["peak_mb"], "HF encode_batch", higher_is_better=False))
                if big_corpus and vocab == vocabs[0]:
                    # HF's fast path: whitespace pre-tokenization (its Onig word regex costs HF ~4x more)
                    ours = measure("_ours_train", str(path), vocab, ours_dir, "whitespace")
                    hf = measure("_hf_train", str(path), vocab, ours_dir, "whitespace")
                    for metric, key in (("seconds (wall)", "wall"), ("CPU seconds", "cpu"), ("peak RSS MB", "peak_mb")):
                        rows.append(Row("tokenizers", f"BPE train, {case}, whitespace pre-tokenizer", metric,
                                        ours[key], hf[key], "HF BpeTrainer (WhitespaceSplit)", higher_is_better=False,
                                        target="ratio <= 3" if key == "cpu" else "",
                                        met=(ours[key] / hf[key] <= 3) if key == "cpu" else None))
    return rows
