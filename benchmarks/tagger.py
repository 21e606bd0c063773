"""Part-of-speech tagging on UD English EWT: our HMM side by side with NLTK's TnT (and NLTK's supervised HMM),
then the BiLSTM tagger beside the HMM and BiLSTM+ELMo beside the BiLSTM (`benchmarks/_tagger_models.py`).

Train on train, calibrate on dev, report test once, for UPOS and XPOS. Ours is trained with the other
column as a training-only state refinement (UPOS states split by XPOS and vice versa), see docs/tagger.md.
Accuracy overall, on known and on unknown words (not seen in train); decoding speed in tokens per CPU
second on one core (process time, so other load on the machine does not count), ours and the peers
in the same run on the same sentences: batched (`tag_many`) and one sentence per call (`tag`), for exact
Viterbi (`viterbi`), the pruned search (`viterbi_pruned`), greedy and beam search.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from lexiflow.models.conllu import read_conllu
from lexiflow.models.hmm import HMMTagger
from lexiflow.models.tagging_metrics import accuracy_report, per_tag_scores

from benchmarks.harness import SHARED_DATA, Row

EWT = SHARED_DATA / "ud-english-ewt"
TARGETS = {"upos": 0.94, "xpos": 0.935}
UNKNOWN_TARGET = 0.80
SPEED_TARGET = 1e5
NEURAL_TARGET = 0.955  # BiLSTM UPOS (issue 23; Stanza's published 95.4-96.2 the anchor)
NEURAL_UNKNOWN_TARGET = 0.88


def _load(split: str, col: str, limit: int | None) -> list[list[tuple[str, str, str]]]:
    other = "xpos" if col == "upos" else "upos"
    out = []
    for s in read_conllu(EWT / f"en_ewt-ud-{split}.conllu"):
        out.append(list(zip(s.words, getattr(s, col), getattr(s, other), strict=True)))
        if limit and len(out) >= limit:
            break
    return out


def _timed(fn, *args, repeats: int = 1, **kw):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn(*args, **kw)
        best = min(best, time.process_time() - t0)
    return out, best


def run(quick: bool = False) -> list[Row]:
    from nltk.tag.tnt import TnT

    logging.getLogger("lexiflow.hmm.tag").setLevel(logging.WARNING)
    n_train, n_dev, n_test = (400, 60, 100) if quick else (None, None, None)
    rows: list[Row] = []
    hmm_reports: dict[str, dict] = {}
    for col in ("upos", "xpos"):
        train, dev, test = _load("train", col, n_train), _load("dev", col, n_dev), _load("test", col, n_test)
        dev2 = [[(w, t) for w, t, _ in s] for s in dev]
        words = [[w for w, _, _ in s] for s in test]
        gold = [[t for _, t, _ in s] for s in test]
        n_tok = sum(map(len, words))
        vocab = {w for s in train for w, _, _ in s}

        t0 = time.process_time()
        ours = HMMTagger(order=3, max_iter=30 if quick else 300).fit(train, dev=dev2)
        fit_s = time.process_time() - t0
        pred, ours_s = _timed(ours.tag_many, words, repeats=1 if quick else 3)
        rep = accuracy_report(words, gold, pred, vocab)

        tnt = TnT()
        t0 = time.process_time()
        tnt.train([[(w, t) for w, t, _ in s] for s in train])
        tnt_fit_s = time.process_time() - t0
        tnt_out, tnt_s = _timed(tnt.tagdents if hasattr(tnt, "tagdents") else tnt.tag_sents, words)
        tnt_pred = [[t for _, t in s] for s in tnt_out]
        tnt_rep = accuracy_report(words, gold, tnt_pred, vocab)

        case = f"EWT test {col.upper()}, {n_tok} tokens" + (" (quick: small slices)" if quick else "")
        target = TARGETS[col]
        cal = ", ".join(f"{k}={v:g}" for k, v in dataclasses.asdict(ours.calibration_).items())
        rows.append(Row("tagger", case, "accuracy", rep["accuracy"], tnt_rep["accuracy"], "nltk TnT",
                        target=f">= {target}", met=rep["accuracy"] >= target,
                        notes=f"trigram HMM, lambdas {ours.lambdas_.round(3).tolist()}, dev acc "
                              f"{ours.dev_accuracy_:.4f}, {cal}; fit {fit_s:.0f}s (TnT {tnt_fit_s:.0f}s)"))
        rows.append(Row("tagger", case, "unknown-word accuracy", rep["unknown_accuracy"],
                        tnt_rep["unknown_accuracy"], "nltk TnT", target=f">= {UNKNOWN_TARGET}",
                        met=rep["unknown_accuracy"] >= UNKNOWN_TARGET,
                        notes=f"{int(rep['unknown_tokens'])} unknown tokens"))
        rows.append(Row("tagger", case, "known-word accuracy", rep["known_accuracy"], tnt_rep["known_accuracy"],
                        "nltk TnT"))
        rows.append(Row("tagger", case, "viterbi (exact) tokens/s batched (1 core, CPU time)", n_tok / ours_s,
                        n_tok / tnt_s, "nltk TnT"))
        pruned, pruned_s = _timed(ours.tag_many, words, method="viterbi_pruned", repeats=1 if quick else 3)
        r = accuracy_report(words, gold, pruned, vocab)
        paths = zip(words, ours.states(words), ours.states(words, method="viterbi_pruned"), strict=True)
        better = sum(ours.path_score(w, a) > ours.path_score(w, b) + 1e-9 for w, a, b in paths)
        rows.append(Row("tagger", case, "viterbi_pruned accuracy", r["accuracy"], tnt_rep["accuracy"], "nltk TnT",
                        notes=f"exact Viterbi scores higher on {better} of {len(words)} sentences, never lower"))
        rows.append(Row("tagger", case, "viterbi_pruned tokens/s batched (1 core, CPU time)", n_tok / pruned_s,
                        n_tok / tnt_s, "nltk TnT", target=f">= {SPEED_TARGET:.0e}",
                        met=n_tok / pruned_s >= SPEED_TARGET))
        for method, width in (("greedy", 0), ("beam", 3), ("beam", 8)):
            p, s = _timed(ours.tag_many, words, method=method, beam_width=width or 8)
            r = accuracy_report(words, gold, p, vocab)
            name = f"{method}{f' {width}' if width else ''}"
            rows.append(Row("tagger", case, f"{name} accuracy", r["accuracy"], tnt_rep["accuracy"], "nltk TnT"))
            rows.append(Row("tagger", case, f"{name} tokens/s batched (1 core, CPU time)", n_tok / s, n_tok / tnt_s,
                            "nltk TnT", target=">= 5e4" if width == 3 else "",
                            met=n_tok / s >= 5e4 if width == 3 else None))
        # per call: one sentence at a time, as `tagger.tag(words)` is used; TnT's tag() the same way
        _, tnt_one = _timed(lambda ws, peer=tnt: [peer.tag(w) for w in ws], words)
        for method in ("viterbi_pruned", "viterbi", "greedy", "beam"):
            _, s = _timed(lambda ws, m=method, t=ours: [t.tag(w, method=m, beam_width=3) for w in ws], words)
            target = method in ("viterbi", "viterbi_pruned")  # exact Viterbi is tag()'s default
            rows.append(Row("tagger", case, f"{method}{' 3' if method == 'beam' else ''} tokens/s, one sentence per "
                            "call (1 core, CPU time)", n_tok / s, n_tok / tnt_one, "nltk TnT tag()",
                            target=">= 5e4" if target else "", met=n_tok / s >= 5e4 if target else None))
        f1 = per_tag_scores(gold, pred).filter(per_tag_scores(gold, pred)["support"] >= 50).sort("f1")
        rows[-1].notes += "; lowest F1 (support >= 50): " + ", ".join(
            f"{t} {v:.3f}" for t, v in f1.select("tag", "f1").head(4).iter_rows())
        if col == "upos" and not quick:
            rows.append(_nltk_hmm_row(train, words, gold, vocab, case, rep["accuracy"]))
        hmm_reports[col] = rep
    rows += _neural_rows(hmm_reports, n_train, n_test)
    return rows


def _neural_rows(hmm: dict[str, dict], n_train: int | None, n_test: int | None) -> list[Row]:
    """The BiLSTM variants and BiLSTM+ELMo (one joint model each: UPOS head 0, XPOS head 1) beside the HMM
    of this run, and ELMo beside the plain BiLSTM. Models come from `benchmarks._tagger_models`'s cache
    (trained there on train, early-stopped on dev); the plain BiLSTM is trained here when missing, the
    other variants are evaluated when trained (the log says when one was not: an hour of CPU each)."""
    import torch

    from benchmarks._tagger_models import VARIANTS, cached, ewt, trained

    torch.set_num_threads(1)  # tokens/s on one core, as the HMM's
    test = ewt("test", n_test)
    words = [[w for w, _, _ in s] for s in test]
    vocab = {w for s in ewt("train", n_train) for w, _, _ in s}
    n_tok = sum(map(len, words))
    quick = n_train is not None
    rows: list[Row] = []
    plain: dict[str, dict] = {}
    for name in ("bilstm", *(v for v in VARIANTS if v != "bilstm")):
        if name != "bilstm" and not trained(name, n_train):
            logging.getLogger("benchmarks.tagger").warning(
                "%s: not evaluated, no trained model (OMP_NUM_THREADS=1 python -m benchmarks._tagger_models %s)",
                name, name)
            continue
        model = cached(name, n_train)
        c = model.config
        label = "BiLSTM" + " + HMM features" * c.hmm_features + " (char BiLSTM)" * (c.char_encoder == "lstm") + \
            " + ELMo" * c.elmo
        hist = model.history_
        train_rate = sum(r["tokens_per_s"] * r["seconds"] for r in hist) / max(sum(r["seconds"] for r in hist), 1e-9)
        for head, col in enumerate(("upos", "xpos")):
            gold = [[t[head + 1] for t in s] for s in test]
            pred, secs = _timed(model.tag_many, words, head=head)
            rep = accuracy_report(words, gold, pred, vocab)
            peer, peer_name = (hmm[col], "our HMM") if name == "bilstm" else (plain[col], "our BiLSTM")
            case = f"EWT test {col.upper()}, {n_tok} tokens, {label}" + (" (quick: small slices)" if quick else "")
            notes = (f"{len(hist)} epochs, dev UPOS {model.dev_accuracy_:.4f}; train {train_rate:.0f} tokens/s "
                     "(wall, one thread, shared 2-core machine)")
            if c.elmo:
                w = model.elmo_weights()
                notes += f"; ELMo layer weights {[round(x, 3) for x in w['weights']]}, gamma {w['gamma']:.3f}"
            target = NEURAL_TARGET if (col == "upos" and not c.elmo) else None
            rows.append(Row("tagger", case, "accuracy", rep["accuracy"], peer["accuracy"], peer_name,
                            target=f">= {target}" if target else "", met=rep["accuracy"] >= target if target else None,
                            notes=notes))
            unk_target = NEURAL_UNKNOWN_TARGET if (col == "upos" and not c.elmo) else None
            rows.append(Row("tagger", case, "unknown-word accuracy", rep["unknown_accuracy"],
                            peer["unknown_accuracy"], peer_name, target=f">= {unk_target}" if unk_target else "",
                            met=rep["unknown_accuracy"] >= unk_target if unk_target else None))
            rows.append(Row("tagger", case, "known-word accuracy", rep["known_accuracy"], peer["known_accuracy"],
                            peer_name))
            rows.append(Row("tagger", case, "tag tokens/s (1 core, CPU time)", n_tok / secs, None, "",
                            notes=f"train {train_rate:.0f} tokens/s (wall, under load)"))
            if name == "bilstm":
                plain[col] = rep
    return rows


def _nltk_hmm_row(train, words, gold, vocab, case, ours_acc) -> Row:
    """NLTK's supervised HMM (MLE with Lidstone emissions): the plain textbook baseline."""
    from nltk.probability import LidstoneProbDist
    from nltk.tag.hmm import HiddenMarkovModelTrainer

    trainer = HiddenMarkovModelTrainer()
    hmm = trainer.train_supervised([[(w, t) for w, t, _ in s] for s in train],
                                   estimator=lambda fd, bins: LidstoneProbDist(fd, 0.1, bins))
    pred, secs = _timed(lambda ws: [[t for _, t in hmm.tag(s)] for s in ws], words)
    rep = accuracy_report(words, gold, pred, vocab)
    n_tok = sum(map(len, words))
    return Row("tagger", case, "accuracy", ours_acc, rep["accuracy"], "nltk HMM (supervised, Lidstone 0.1)",
               notes=f"nltk HMM unknown-word accuracy {rep['unknown_accuracy']:.3f}, {n_tok / secs:.0f} tokens/s")
