"""`lexiflow tag`, `generate` and `translate`: trained models on the user's text."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lexiflow.flows.commands.common import DEFAULT_STORE, pick, read_catalog


def tagger_manifests(catalog, versions: list[str]) -> dict[str, dict[str, Any]]:
    """Tag set (upos, xpos) -> the manifest of the tagger that predicts it: the given versions, one
    per tag set, or with `latest` the latest tagger of each tag set (the pipeline trains one per set)."""
    from lexiflow.models.conllu import TAG_COLUMNS
    from lexiflow.models.errors import ParameterError
    from lexiflow.storage import StoreError

    if versions == ["latest"]:
        manifests = catalog.list("tagger") or [catalog.get("tagger")]  # oldest first: a tag set's latest stays;
        # none: get's "not found", with what builds one
    elif "latest" in versions:
        raise ParameterError("--tagger latest picks the latest tagger of each tag set: give it alone, or versions")
    else:
        manifests = [catalog.get("tagger", version) for version in versions]
    chosen: dict[str, dict[str, Any]] = {}
    for manifest in manifests:
        column = manifest["metrics"].get("column")  # the tag set it was trained on
        if column not in TAG_COLUMNS:
            raise StoreError(f"tagger:{manifest['version']}: records no tag set ({' or '.join(TAG_COLUMNS)}), "
                             f"found {column!r}; retrain it with the pipeline")
        if versions != ["latest"] and column in chosen:
            raise ParameterError(f"--tagger {chosen[column]['version']} {manifest['version']}: both predict "
                                 f"{column}; give one tagger per tag set")
        chosen[column] = manifest
    return chosen


def check_tag_paths(source: Path, output: Path | None) -> None:
    """Refuse what `tag` cannot read or write before any work, with what to do."""
    from lexiflow.models.errors import InputError

    if source.is_dir():
        raise InputError(f"{source}: is a folder; give a .conllu or plain-text file")
    if not source.is_file():
        raise InputError(f"{source}: no such file")
    if source.name.lower().endswith((".gz", ".bz2", ".xz", ".zst", ".zip")):
        raise InputError(f"{source}: compressed; decompress it first (tag reads UTF-8 plain text or .conllu)")
    if output is None:
        return
    if output.exists() and output.samefile(source):
        raise InputError(f"-o {output}: is the input file; write the tagged file elsewhere")
    if output.is_dir():
        raise InputError(f"-o {output}: is a folder; give a file name, e.g. {output / (source.stem + '.conllu')}")
    if not output.parent.is_dir():
        why = "is not a folder" if output.parent.exists() else "does not exist"
        raise InputError(f"-o {output}: its folder {output.parent} {why}; create it or write elsewhere")


def write_whole(path: Path, chunks: Iterable[str]) -> None:
    """Write a file whole or not at all: into a temporary file beside it, renamed over it once complete
    (a failure leaves the previous file, or none, never a partial one)."""
    from lexiflow.models.errors import InputError

    partial = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
    try:
        with open(partial, "x", encoding="utf-8") as f:  # "x": a new file, with the umask's permissions
            f.writelines(chunks)
        os.replace(partial, path)
    except OSError as exc:
        raise InputError(f"-o {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        partial.unlink(missing_ok=True)


def cmd_tag(args: argparse.Namespace) -> int:
    """Tag a CoNLL-U file (predicted tags replace its UPOS/XPOS columns) or plain text (written as CoNLL-U).
    Everything is read and tagged before the output is written; a tag set no tagger predicts is `_`."""
    from lexiflow.loaders import load_tagger
    from lexiflow.models import conllu
    from lexiflow.models.errors import InputError, shown

    source, output = Path(args.input), Path(args.output) if args.output else None
    check_tag_paths(source, output)
    catalog = read_catalog(args.store)
    taggers = {column: load_tagger(catalog.store, manifest)  # any kind: HMM, BiLSTM, BiLSTM+ELMo
               for column, manifest in tagger_manifests(catalog, args.tagger).items()}
    try:
        lines = list(conllu.utf8_lines(source))
    except OSError as exc:
        raise InputError(f"{source}: cannot read it ({exc.strerror})") from None
    is_conllu = source.suffix.lower() == ".conllu"  # as ingestion reads names: EN_EWT.CONLLU is CoNLL-U
    if is_conllu:
        sentences = [s.words for s in conllu.parse_lines(lines, source=shown(source))]
    else:  # a line is a document, as ingestion reads plain text: sentences never run across lines
        from lexiflow.models.text import sentence_words

        sentences = sentence_words("".join(lines).splitlines())
    tags = {column: taggers[column].tag_many(sentences, method=args.method) if column in taggers
            else [["_"] * len(words) for words in sentences]  # never the input's own (gold) tags
            for column in conllu.TAG_COLUMNS}
    if is_conllu:
        chunks = conllu.replace_tags(lines, tags)
    else:
        chunks = (conllu.format_sentence(conllu.Sentence(words=words, upos=tags["upos"][i], xpos=tags["xpos"][i],
                                                         sent_id=str(i + 1))) for i, words in enumerate(sentences))
    if output is None:
        sys.stdout.writelines(chunks)
    else:
        write_whole(output, chunks)
    return 0


STRATEGY_OPTIONS = {"beam": ("width",), "sample": ("temperature", "top_k", "top_p", "seed")}  # None: not given


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue a prompt with a trained language model and its own tokenizer."""
    from lexiflow.loaders import load
    from lexiflow.models.errors import ParameterError
    from lexiflow.models.lm.decoding import generate, never_generated
    from lexiflow.models.text import normalize

    options: dict[str, Any] = {}
    for strategy, names in STRATEGY_OPTIONS.items():
        for name in (n for n in names if getattr(args, n) is not None):
            if strategy != args.strategy:  # silently ignoring it would mislead
                raise ParameterError(f"--{name.replace('_', '-')} applies to --strategy {strategy} only; "
                                     f"add --strategy {strategy} or leave it out")
            options[name] = getattr(args, name)
    if args.max_tokens < 0:
        raise ParameterError(f"--max-tokens={args.max_tokens}: generate 0 tokens or more")
    if not 0 < args.repetition_penalty < float("inf"):
        raise ParameterError(f"--repetition-penalty={args.repetition_penalty}: use a number > 0 (1 is off, "
                             f"1.2 a mild penalty)")
    if args.no_repeat_ngram < 0:
        raise ParameterError(f"--no-repeat-ngram={args.no_repeat_ngram}: use 0 (off) or an n-gram size >= 1")
    catalog = read_catalog(args.store)
    manifest = pick(catalog, "lm" if args.lm == "latest" else f"lm:{args.lm}")
    model = load(catalog, "lm", manifest["version"])
    tokenizer_manifest = catalog.get("tokenizer", manifest["inputs"]["tokenizer"]["version"])
    tokenizer = load(catalog, "tokenizer", tokenizer_manifest["version"])
    text = normalize(args.prompt, lowercase=catalog.lowercased(tokenizer_manifest))  # as the corpus text was
    prompt = tokenizer.encode(text)
    options.update(max_new_tokens=args.max_tokens, eos_id=tokenizer.eos_id,
                   banned=never_generated(tokenizer, allow_unk=args.allow_unk),
                   repetition_penalty=args.repetition_penalty, no_repeat_ngram=args.no_repeat_ngram)
    new = generate(model.log_probs_batch, [tokenizer.bos_id, *prompt], strategy=args.strategy, **options)
    print(tokenizer.decode(prompt + new))
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    """Translate a line per sentence (a file or standard input) with a trained seq2seq model; everything is
    translated before the output is written, whole (`-o`) or to standard output."""
    from lexiflow.loaders import load
    from lexiflow.models.errors import InputError, ParameterError

    if args.beam < 1:
        raise ParameterError(f"--beam={args.beam}: use 1 (greedy) or more")
    catalog = read_catalog(args.store)
    model = catalog.get("seq2seq", None if args.model == "latest" else args.model)  # before waiting for the input
    if args.input == "-":
        lines = sys.stdin.read().splitlines()
    else:
        source = Path(args.input)
        if not source.is_file():
            raise InputError(f"{source}: no such file" + (" (a folder)" if source.is_dir() else ""))
        try:
            lines = source.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            line = source.read_bytes()[: exc.start].count(b"\n") + 1
            raise InputError(f"{source}:{line}: invalid UTF-8; re-encode the file as UTF-8") from None

    translator = load(catalog, "seq2seq", model["version"])
    out = [t + "\n" for t in translator.translate(lines, beam_width=args.beam)]
    if args.output is None:
        sys.stdout.writelines(out)
    else:
        write_whole(Path(args.output), out)
    return 0


def add_parsers(sub: Any) -> None:
    tag = sub.add_parser("tag", help="tag a CoNLL-U or plain-text file with trained taggers (HMM or neural)")
    tag.add_argument("input", help="a UTF-8 .conllu file (its UPOS and XPOS columns are replaced) or plain text")
    tag.add_argument("-o", "--output", help="output CoNLL-U file, not the input (default: standard output)")
    tag.add_argument("--tagger", nargs="+", default=["latest"], metavar="VERSION|tagger@NAME",
                     help="tagger artifact versions or aliases (tagger@production), one per tag set (default: latest, "
                          "the latest tagger of each tag set, UPOS and XPOS); a tag set no tagger predicts is written "
                          "as _")
    tag.add_argument("--method", choices=["viterbi", "greedy", "beam"], default="viterbi", help="decoding")
    tag.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
    tag.set_defaults(func=cmd_tag)

    gen = sub.add_parser("generate", help="continue a prompt with a trained language model")
    gen.add_argument("--lm", default="latest", metavar="VERSION|MODEL|lm@NAME",
                     help="lm artifact version, a model kind (lstm, ngram, ...) for its latest, or an alias "
                          "(lm@production) (default: the latest)")
    gen.add_argument("--prompt", required=True, help="the text to continue")
    gen.add_argument("--strategy", choices=["greedy", "beam", "sample"], default="greedy",
                     help="decoding (default greedy: the most readable on the default corpus; beam writes short "
                          "sentences, sampling varied but less grammatical ones)")
    gen.add_argument("--max-tokens", type=int, default=30, help="tokens to generate at most")
    gen.add_argument("--width", type=int, help="beam width (--strategy beam; default 4)")
    gen.add_argument("--temperature", type=float, help="sampling temperature, 0 = greedy (--strategy sample; "
                                                       "default 1.0)")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely tokens (--strategy sample)")
    gen.add_argument("--top-p", type=float, help="nucleus: the smallest set with mass >= p (--strategy sample)")
    gen.add_argument("--seed", type=int, help="sampling seed (--strategy sample; default 0)")
    gen.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                     help="a token already in the text has its log-probability multiplied by R, its probability "
                          "raised to the power R (HF's repetition_penalty; default 1: off)")
    gen.add_argument("--no-repeat-ngram", type=int, default=3, metavar="N",
                     help="never repeat an N-gram of the text (HF's no_repeat_ngram_size; default 3, which stops "
                          "greedy search looping on the default corpus's n-gram LM; 0: off)")
    gen.add_argument("--allow-unk", action="store_true",
                     help="let the model write <unk> (never by default; <s> and <pad> never)")
    gen.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
    gen.set_defaults(func=cmd_generate)

    tr = sub.add_parser("translate", help="translate a line per sentence with a trained seq2seq model")
    tr.add_argument("input", nargs="?", default="-", help="a UTF-8 text file, one sentence per line (default -: "
                                                          "standard input)")
    tr.add_argument("-o", "--output", help="output file, written whole once every line is translated (default: "
                                           "standard output)")
    tr.add_argument("--model", default="latest", metavar="VERSION|seq2seq@NAME",
                    help="seq2seq artifact version or alias, e.g. seq2seq@production (default: latest)")
    tr.add_argument("--beam", type=int, default=5, help="beam width (1 = greedy; default 5)")
    tr.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")
    tr.set_defaults(func=cmd_translate)
