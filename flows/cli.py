"""The `lexiflow` command line.

    lexiflow run [--store DIR] [--corpus SOURCE ...] [--config FILE] [--set key=value ...]
    lexiflow release KIND:VERSION [--as NAME] [--reason TEXT] [--store DIR]    (NAME: default production)
    lexiflow release --rollback KIND [--as NAME] [--reason TEXT] [--store DIR]
    lexiflow release --log KIND [--as NAME] [--json] [--store DIR]
    lexiflow artifacts list [--store DIR] [--kind KIND] [--json]
    lexiflow artifacts show KIND[:VERSION|:TAG|@NAME] [--store DIR]  (TAG: method, tokenizer kind, model, column)
    lexiflow artifacts verify [--store DIR] [--full]
    lexiflow generate --prompt TEXT [--lm VERSION|lm@NAME] [--strategy greedy|beam|sample] [--top-k K] [--top-p P]
    lexiflow tag INPUT [-o OUTPUT] [--tagger VERSION|tagger@NAME ...] [--method viterbi|greedy|beam]
    lexiflow translate [INPUT] [-o OUTPUT] [--model VERSION|seq2seq@NAME] [--beam N]
    lexiflow artifacts export KIND[:VERSION|:TAG|@NAME] DIR [--store DIR]
    lexiflow artifacts rm KIND:VERSION [--force] [--store DIR]
    lexiflow artifacts gc [--keep N] [--older-than SECONDS] [--dry-run] [--store DIR]
    lexiflow serve [--home DIR] [--port N] [--store DIR] [--corpus SOURCE ...] [--cron CRON] [--timezone TZ]
                   [--config FILE] [--set key=value ...] [--serving DIR] [--gpus 0,1] | --stop

Errors a user can fix print one line (`error: ...`) and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lexiflow.flows import config, prefect_env

if TYPE_CHECKING:
    from lexiflow.flows.params import PipelineParams

DEFAULT_STORE = os.environ.get("LEXIFLOW_STORE", "artifacts")


def params_tree(args: argparse.Namespace) -> dict[str, Any]:
    """Config file ← --store ← --corpus ← --set, as given (`validate` adds the defaults and checks the whole)."""
    from lexiflow.flows.config import parameter_tree

    return parameter_tree(args.config, args.set, {
        "store": args.store or None, "corpus.sources": args.corpus or None,
        "release.when": "always" if getattr(args, "release", False) else None})


def pipeline_params(args: argparse.Namespace):
    """Defaults ← config file ← --corpus ← --set, validated as a whole."""
    from lexiflow.flows.params import validate

    return validate(params_tree(args))


def cmd_run(args: argparse.Namespace) -> int:
    from lexiflow.flows import server

    home = prefect_env.default_home()
    tree = params_tree(args)
    # A first run into a store starts its temporary server now: its start-up overlaps the imports below.
    if "store" in tree:
        store = str(tree["store"])
    else:
        from lexiflow.storage.store import DEFAULT_ROOT as store  # 3 s of imports: a named store waits none
    server.prestart(home, store)
    try:
        from lexiflow.flows.params import validate

        params = validate(tree)
        prestart_cluster(params)
        from lexiflow.flows.pipeline import reuse_all, run_pipeline
        from lexiflow.storage import ArtifactStore

        ArtifactStore(params.store).check_root()  # before the run: one line, not a failed run
        # With no server to report to, a rerun that finds every artifact starts none (docs/design.md, "Caching")
        refs = reuse_all(params) if server.running(home) is None else None
        if refs is None:
            with prefect_api(home):
                refs = run_pipeline(params)
    except BaseException:
        server.stop_temporary()  # bad parameters found after `prestart`: its server goes at once, not at exit
        raise
    store = ArtifactStore(params.store)
    print(f"\nArtifacts in {store.root}:")
    for name, ref in refs.items():
        print(f"  {name:<17} {ref.version}  {store.path(ref.kind, ref.version)}")
    report = refs["report"]
    print(f"\nEvaluation report: {store.path(report.kind, report.version, 'report.md')}")
    print("Headline figures:")
    for name, ref in refs.items():
        if (figures := headline(ref.kind, store.manifest(ref.kind, ref.version)["metrics"])) is not None:
            print(f"  {name:<17} {figures}")
    return 0


def prestart_cluster(params: PipelineParams) -> None:
    """A Dask run without a cluster address whose corpus is more than one shard (or whose shards are set in rows)
    starts its LocalCluster now, in the background: its workers start while this process imports the pipeline
    (~8 s on one core), not in the first stage (300 MB on 2 cores: ~3 s). A smaller corpus runs its shards here,
    with no cluster."""
    parallel = params.parallel
    if parallel.runner != "dask" or parallel.dask_address:
        return
    from lexiflow.models.errors import LexiflowError
    from lexiflow.models.ingest.sources import resolve_sources
    from lexiflow.tasks.runners import start_local_cluster

    with contextlib.suppress(LexiflowError, OSError):  # a bad source is the corpus stage's to report
        if parallel.shard_rows or sum(path.stat().st_size for path in resolve_sources(params.corpus.sources)) \
                > parallel.shard_bytes:
            start_local_cluster(parallel.workers)


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[str]:
    """Run against the server `flows/server.py` chooses (the user's, `lexiflow serve`'s, or a temporary
    one tied to this process), in this process and in the processes it starts."""
    from lexiflow.flows import server
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    api_url = server.choose(home, say=lambda line: print(line, file=sys.stderr, flush=True))
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url  # process-pool shards inherit it
    try:
        if api_url == get_current_settings().api.url:
            yield api_url  # already this process's server: a second settings context would start a second
            return  # set of Prefect's event/log workers, which the first context's shutdown then waits on
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield api_url
    finally:
        flush_prefect_workers()
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def flush_prefect_workers(timeout: float = 30.0) -> None:
    """Send the run's queued logs and events while its server is up, and stop those workers: a worker
    left bound to a server that goes away (a `lexiflow serve` stopped later) would make a later drain in
    this process (Prefect's, at exit or in a test harness) wait for it forever."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=timeout)


def headline(kind: str, metrics: dict[str, Any]) -> str | None:
    """The headline figures of an artifact's manifest metrics (None for kinds without any): a score
    with nothing to score (null in the manifest, NaN in older ones) is "–", an infinite perplexity "inf"."""
    from lexiflow.storage.manifests import metric_number
    from lexiflow.tasks.report_image import HEADLINE

    def figure(key: str, digits: int) -> str:
        value = metric_number(metrics.get(key))
        return "–" if value is None else f"{value:.{digits}f}"

    if kind == "evaluation":
        return ", ".join(f"{k} {figure(k, 3)}" for k in HEADLINE)
    if kind == "tagger":
        return ", ".join(f"{k} {figure(k, 4)}" for k in ("accuracy", "known_accuracy", "unknown_accuracy")
                         if metrics.get(k) is not None) or "not evaluated (no valid or test sentences)"
    if kind == "lm":
        return ", ".join(f"{k} {figure(k, 1)}" for k in ("valid_perplexity", "valid_word_perplexity",
                                                         "test_perplexity", "test_word_perplexity")
                         if metrics.get(k) is not None)
    return None


def read_catalog(store: str):
    """The catalog of a store that read-only commands read: a local path that does not exist, or is
    not a folder, is a mistyped --store, not an empty store. (Object stores: no artifacts yet is fine.)"""
    from lexiflow.storage import Catalog

    catalog = Catalog(store)
    catalog.store.check_root(create=False)
    return catalog


def _listing(manifest: dict[str, Any], aliases: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {"kind": manifest["kind"], "version": manifest["version"], "created": manifest["created"],
            "aliases": names_of(aliases, manifest["kind"], manifest["version"]),
            "inputs": {name: ref["version"] for name, ref in manifest["inputs"].items()},
            "parameters": manifest["parameters"], "metrics": manifest["metrics"], "path": manifest["path"]}


def names_of(aliases: dict[str, dict[str, str]], kind: str, version: str) -> list[str]:
    """The aliases (`Catalog.aliases()`) that name `kind:version`."""
    return sorted(name for name, named in aliases.get(kind, {}).items() if named == version)


def strict_json(obj: Any) -> str:
    """JSON output by the manifest convention (manifests written before it may hold NaN/Infinity)."""
    from lexiflow.storage.manifests import json_safe

    return json.dumps(json_safe(obj), indent=2, default=str, allow_nan=False)


def cmd_list(args: argparse.Namespace) -> int:
    from lexiflow.storage.formats import DISTINGUISHED_BY

    catalog = read_catalog(args.store)
    aliases = catalog.aliases(args.kind)
    manifests = [_listing(m, aliases) for m in catalog.list(args.kind)]
    for reason in catalog.left_out:
        print(f"warning: left out: {reason}", file=sys.stderr)
    if args.json:
        print(strict_json(manifests))
        return 0
    if not manifests:
        print(f"no artifacts in {args.store}")
    for m in manifests:
        inputs = ", ".join(f"{k}={v}" for k, v in m["inputs"].items()) or "-"
        tag = m["metrics"].get(DISTINGUISHED_BY.get(m["kind"], ""), "-")  # what tells it from others of its kind
        released = "".join(f"@{name} " for name in m["aliases"])
        print(f"{m['kind']:<17} {m['version']}  {tag!s:<11} {m['created'][:19]}  {released}inputs: {inputs}")
    return 0


def pick(catalog, spec: str) -> dict[str, Any]:
    """The manifest `KIND`, `KIND:VERSION`, `KIND:TAG` or `KIND@NAME` names: the latest of the kind, a version
    (16 hex digits), the latest with that method / tokenizer kind / model / tag column (`embeddings:glove`,
    `tokenizer:bpe`, `lm:lstm`, `tagger:upos`), or the version an alias names (`embeddings@production`;
    `lm:lm@production` too, as `--lm` builds it)."""
    import re

    from lexiflow.models.errors import ParameterError
    from lexiflow.storage.catalog import split_alias
    from lexiflow.storage.formats import DISTINGUISHED_BY
    from lexiflow.storage.manifests import validate_kind

    kind, _, which = spec.partition(":")
    validate_kind(split_alias(kind)[0])  # a hostile name is refused as such, before it is read as a tag
    if not which or "@" in which or re.fullmatch(r"[0-9a-f]{16}", which):
        return catalog.get(kind, which or None)
    if re.fullmatch(r"[0-9a-fA-F]*[0-9][0-9a-fA-F]*", which) or re.fullmatch(r"[0-9a-fA-F]{16}", which):
        raise ParameterError(f"{spec}: {which!r} is not a version: a version is 16 lowercase hexadecimal digits, "
                             f"whole (`lexiflow artifacts list --kind {kind}` shows them)")
    if kind not in DISTINGUISHED_BY:
        raise ParameterError(f"{spec}: {which!r} is not a version (16 hex digits), and {kind} artifacts have no "
                             f"tag to select by; use KIND or KIND:VERSION")
    return catalog.get(kind, **{DISTINGUISHED_BY[kind]: which})


def cmd_show(args: argparse.Namespace) -> int:
    catalog = read_catalog(args.store)
    manifest = pick(catalog, args.artifact)
    manifest["aliases"] = names_of(catalog.aliases(manifest["kind"]), manifest["kind"], manifest["version"])
    manifest["lineage"] = catalog.lineage(manifest["version"])
    print(strict_json(manifest))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    checked, problems = read_catalog(args.store).audit(full=args.full)
    for problem in problems:
        print(problem)
    print(f"{checked} artifacts checked ({'checksums' if args.full else 'sizes'}), {len(problems)} problems")
    return 1 if problems else 0


def cmd_rm(args: argparse.Namespace) -> int:
    from lexiflow.models.errors import ParameterError
    from lexiflow.storage import StoreError
    from lexiflow.storage.releases import deleting, pending_versions

    kind, _, version = args.artifact.partition(":")
    if not version:
        raise ParameterError(f"{args.artifact}: give KIND:VERSION (`lexiflow artifacts list` shows them)")
    catalog = read_catalog(args.store)
    store = catalog.store
    with deleting(catalog, _announcer(catalog)):  # no alias moves while it decides and deletes
        if not store.exists(kind, version):
            raise StoreError(f"no artifact {kind}:{version} in {store.url}")
        released = names_of(catalog.aliases(kind), kind, version)
        if (kind, version) in pending_versions(store) and not args.force:
            raise StoreError(f"{kind}:{version} is being released; try again once the release is done")
        if released and not args.force:
            raise StoreError(f"{kind}:{version} is released as {', '.join(f'{kind}@{name}' for name in released)}; "
                             "release another version first, or add --force (the alias then names a missing artifact)")
        built_from_it = catalog.dependents(kind, version)
        if built_from_it and not args.force:
            raise StoreError(f"{kind}:{version}: {len(built_from_it)} artifact(s) were built from it "
                             f"({', '.join(built_from_it[:5])}{', ...' if len(built_from_it) > 5 else ''}); remove "
                             "them first, or add --force (they stay usable, their lineage then names a missing input)")
        store.delete(kind, version)
    print(f"removed {kind}:{version}")
    if built_from_it:
        print(f"{len(built_from_it)} artifact(s) built from it stay usable; their lineage names {kind}:{version} as "
              "missing, and the next run that needs it rebuilds it (same version): "
              + ", ".join(built_from_it))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from lexiflow.storage.pieces import garbage as piece_garbage
    from lexiflow.storage.pieces import remove_garbage as remove_piece_garbage
    from lexiflow.storage.releases import deleting

    catalog = read_catalog(args.store)
    store = catalog.store
    with deleting(catalog, _announcer(catalog)):  # no alias moves between deciding and deleting
        leftovers = store.leftovers(older_than=args.older_than)
        versions = catalog.unreferenced(args.keep) if args.keep is not None else []
        pieces = piece_garbage(store, args.older_than, gone=versions)  # docs/design.md, "Incremental rebuilds"
        verb = "would remove" if args.dry_run else "removed"
        if not args.dry_run:
            store.remove_leftovers(leftovers)
            for kind, version in versions:
                store.delete(kind, version)
            remove_piece_garbage(store, pieces)
    for entry in leftovers:
        print(f"{verb} leftover {entry}")
    if pieces:
        print(f"{verb} {len(pieces)} pieces and records of partial results no artifact uses")
    for kind, version in versions:
        print(f"{verb} {kind}:{version}")
    policy = (f"keeping the {args.keep} newest of each kind, the released ones and what they were built from"
              if args.keep is not None
              else "no --keep: every artifact kept")
    print(f"{verb} {len(leftovers)} leftovers of killed writers and {len(versions)} artifacts ({policy})")
    return 0


def _announcer(catalog):
    """How this command sends the events of alias moves (flows/release.py), imported only when it moves or deletes."""
    from lexiflow.flows.release import announcer

    return announcer(catalog.store.url)


def printable(text: str) -> str:
    """`text` for one line of a terminal: control characters (newlines, escapes) as Python writes them escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def cmd_release(args: argparse.Namespace) -> int:
    """Move an alias to a version (`KIND:VERSION`, or `KIND:TAG`/`KIND@OTHER` for the version they name), or
    back one release (`--rollback KIND`), and print the move; or print a kind's release log (`--log KIND`)."""
    from lexiflow.models.errors import ParameterError
    from lexiflow.storage import StoreError
    from lexiflow.storage.catalog import DEFAULT_ALIAS, validate_alias

    catalog = read_catalog(args.store)
    action = "--rollback" if args.rollback else "--log" if args.log else None
    if action and (":" in args.artifact or "@" in args.artifact):
        raise ParameterError(f"{action} {args.artifact}: give the kind alone (e.g. {action} embeddings), with --as "
                             "NAME for one alias")
    alias = None if args.log and args.alias is None else validate_alias(DEFAULT_ALIAS if args.alias is None
                                                                        else args.alias)
    if args.log:
        entries = catalog.release_log(args.artifact, alias)
        if alias is not None and not entries:
            raise StoreError(f"no alias {alias!r} for {args.artifact} in {catalog.store.url}: nothing released under "
                             "it (`lexiflow artifacts list` shows the aliases there)")
        if args.json:
            print(strict_json(entries))
        for e in [] if args.json else entries:
            print(f"{e['kind']}@{e['alias']} #{e['seq']} {e['at'][:19]} {e['action']:<8} {e['from'] or '(none)'} -> "
                  f"{e['to']}" + (f"  reason: {printable(e['reason'])}" if e["reason"] else "")
                  + (f"  flow run: {printable(e['flow_run'])}" if e["flow_run"] else ""))
        return 0
    if args.rollback:
        entry = catalog.rollback(args.artifact, alias, reason=args.reason, announce=_announcer(catalog))
    else:
        if ":" not in args.artifact and "@" not in args.artifact:
            raise ParameterError(f"{args.artifact}: give KIND:VERSION to release (`lexiflow artifacts list` shows "
                                 "them), or --rollback KIND")
        manifest = pick(catalog, args.artifact)
        entry = catalog.release(manifest["kind"], manifest["version"], alias, reason=args.reason,
                                announce=_announcer(catalog))
    if entry.get("unchanged"):
        print(f"{entry['kind']}@{entry['alias']} already names {entry['to']}: nothing moved"
              + (", the reason is not recorded" if args.reason else ""))
        return 0
    print(f"{entry['kind']}@{entry['alias']}: {entry['from'] or '(none)'} -> {entry['to']}"
          + (" (rollback)" if entry["action"] == "rollback" else ""))
    return 0


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


def cmd_export(args: argparse.Namespace) -> int:
    from lexiflow.loaders import EXPORT_EXTRAS
    from lexiflow.storage.export import export

    catalog = read_catalog(args.store)
    manifest = pick(catalog, args.artifact)
    for path in export(catalog, manifest["kind"], manifest["version"], args.dest, EXPORT_EXTRAS):
        print(path)
    return 0


def _absolute(location: str) -> str:
    """A local path made absolute, since deployed runs work in the code folder, not here; a URL (s3://...)
    or a built-in corpus as given."""
    from fsspec.utils import get_protocol

    if location.startswith("builtin:") or "://" in location or get_protocol(location) != "file":
        return location
    return os.path.abspath(location)


def cmd_serve(args: argparse.Namespace) -> int:
    from lexiflow.deployments import serve

    home = Path(args.home) if args.home else prefect_env.default_home()
    if args.stop:
        lines = serve.stop(home)
        print("\n".join(lines) if lines else f"nothing to stop (no {serve.SERVE_STATE} in {home})")
        return 1 if any(line.endswith("still running!") for line in lines) else 0
    from lexiflow.deployments.definitions import deploy_config

    tree = config.parameter_tree(args.config, args.set)
    store = args.store or tree.get("store")
    settings = deploy_config(
        tree, store=store and _absolute(str(store)), rebuild_cron=args.cron, timezone=args.timezone,
        serving=_absolute(args.serving) if args.serving else None if "://" not in str(store or "") else str(
            home / "serving"),  # an object store's exports go in the server's home
        sources=[_absolute(s) for s in args.corpus or tree.get("corpus", {}).get("sources") or []] or None)
    try:
        state = serve.start(home, settings, port=args.port, gpus=args.gpus.split(",") if args.gpus else None)
    except serve.ServeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for warning in state.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"Prefect UI: {state['ui_url']}   (PREFECT_API_URL={state['api_url']})")
    print(f"Store: {settings.store}\nDeployments: {', '.join(state['deployments'])}")
    print(f"Schedule: corpus-rebuild at cron '{settings.rebuild_cron}' in time zone {settings.timezone} "
          f"(--cron, --timezone)")
    if settings.parameters:
        print(f"Parameters of pipeline and corpus-rebuild (--config, --set): {json.dumps(settings.parameters)}")
    print(f"serve-release exports to: {settings.serving} (--serving)")
    for proc in state["processes"]:
        print(f"  {proc['name']:<12} pid {proc['pid']:<8} log {proc['log']}")
    print("Stop everything with: lexiflow serve --stop" + (f" --home {args.home}" if args.home else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lexiflow", description="Batch NLP pipeline on Prefect.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the pipeline", description=(
        "Run the full pipeline (corpus → vocabulary → co-occurrence → PPMI → SVD → evaluation). "
        "Stages whose inputs and parameters are unchanged are reused from the store."))
    run.add_argument("--store", help=f"artifact store folder or fsspec URL (default {DEFAULT_STORE})")
    run.add_argument("--corpus", nargs="+", metavar="SOURCE",
                     help="corpus sources: files, folders, globs, builtin:enwiki (default) or builtin:lee")
    run.add_argument("--config", metavar="FILE", help="pipeline parameters as TOML or JSON (sections as in --set)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a parameter by dotted name, e.g. --set svd.dim=200 --set corpus.lowercase=false")
    run.add_argument("--release", action="store_true",
                     help="release what the run built (move KIND@production; --set release.alias=NAME for another "
                          "alias) when every blocking check passes; else the run fails naming the checks")
    run.set_defaults(func=cmd_run)

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

    rel = sub.add_parser("release", help="name a version for downstream jobs (an alias: KIND@NAME), or roll it back",
                         description="Point the alias KIND@NAME (default production) at a version, or with --rollback "
                                     "back at the version it named before; every move is appended to the alias's "
                                     "release log in the store (--log prints it). Downstream jobs read KIND@NAME.")
    rel.add_argument("artifact", metavar="KIND:VERSION | KIND",
                     help="the version to release, e.g. embeddings:3f2a... (also KIND:TAG or KIND@OTHER); with "
                          "--rollback or --log the kind alone")
    rel.add_argument("--as", dest="alias", metavar="NAME", help="the alias to move (default production; --log: "
                                                                "every alias of the kind)")
    mode = rel.add_mutually_exclusive_group()
    mode.add_argument("--rollback", action="store_true", help="move the alias back one release")
    mode.add_argument("--log", action="store_true", help="print the kind's release log (every move, oldest first)")
    rel.add_argument("--json", action="store_true", help="--log as JSON: kind, alias, seq, action, from, to, at, "
                                                         "reason, flow_run per move")
    rel.add_argument("--reason", default="", metavar="TEXT", help="why, for the release log")
    rel.set_defaults(func=cmd_release)

    artifacts = sub.add_parser("artifacts", help="inspect the artifact store")
    art = artifacts.add_subparsers(dest="artifacts_command", required=True)
    ls = art.add_parser("list", help="list artifacts, oldest first")
    ls.add_argument("--kind", help="only this kind")
    ls.add_argument("--json", action="store_true",
                    help="JSON: kind, version, created, inputs, parameters, metrics, path per artifact")
    ls.set_defaults(func=cmd_list)
    show = art.add_parser("show", help="one artifact's manifest and lineage")
    show.add_argument("artifact", metavar="KIND[:VERSION|:TAG|@NAME]",
                      help="e.g. embeddings (the latest), embeddings:glove (the latest GloVe), embeddings:3f2a... or "
                           "embeddings@production (the released one)")
    show.set_defaults(func=cmd_show)
    verify = art.add_parser("verify", help="check every artifact's files against its manifest")
    verify.add_argument("--full", action="store_true", help="also compare SHA-256 checksums")
    verify.set_defaults(func=cmd_verify)
    exp = art.add_parser("export", help="copy an artifact into a folder in open formats (Parquet, word2vec, "
                                        "tokenizer.json, safetensors)")
    exp.add_argument("artifact", metavar="KIND[:VERSION|:TAG|@NAME]",
                     help="e.g. embeddings (the latest), tokenizer:bpe (the latest BPE), tokenizer:3f2a... or "
                          "embeddings@production")
    exp.add_argument("dest", metavar="DIR", help="destination folder (created if missing)")
    exp.set_defaults(func=cmd_export)
    rm = art.add_parser("rm", help="remove one artifact (refused when others were built from it or an alias names "
                                   "it, unless --force)")
    rm.add_argument("artifact", metavar="KIND:VERSION", help="e.g. corpus:3f2a...")
    rm.add_argument("--force", action="store_true",
                    help="remove it although artifacts were built from it or an alias names it (they stay; it is "
                         "rebuilt when needed)")
    rm.set_defaults(func=cmd_rm)
    gc = art.add_parser("gc", help="remove what killed writers left and, with --keep, old unreferenced artifacts",
                        description="Removes staging folders and temporary copies of killed writers (a live writer "
                                    "holds a lock and is never touched) and, with --keep N, every artifact that is "
                                    "neither among the N newest of its kind, nor released (an alias names it, or "
                                    "its rollback returns to it), nor an input (transitively) of one of those: "
                                    "the latest reports and the released versions keep their whole lineage.")
    gc.add_argument("--keep", type=int, metavar="N", help="keep the N newest artifacts of each kind (and their inputs)")
    gc.add_argument("--older-than", type=float, default=3600, metavar="SECONDS",
                    help="age after which leftovers no lock protects (object-store uploads, saved scratch state, "
                         "staging without a lock file) count as abandoned (default 3600)")
    gc.add_argument("--dry-run", action="store_true", help="only print what would be removed")
    gc.set_defaults(func=cmd_gc)
    for p in (rel, ls, show, verify, exp, rm, gc):
        p.add_argument("--store", default=DEFAULT_STORE, help=f"artifact store (default {DEFAULT_STORE})")

    srv = sub.add_parser("serve", help="one box: Prefect server, work pools, deployments, CPU and GPU workers",
                         description="Start a Prefect server on 127.0.0.1, create the cpu and gpu work pools, deploy, "
                                     "and start a CPU worker and a GPU worker per GPU; --stop stops exactly those.")
    srv.add_argument("--stop", action="store_true", help="stop what `lexiflow serve` started (by PID)")
    srv.add_argument("--home", help="PREFECT_HOME: database, logs, state file (default $PREFECT_HOME or .prefect)")
    srv.add_argument("--port", type=int, help="server port on 127.0.0.1 (default: a free one)")
    srv.add_argument("--store", help=f"artifact store the workers share (default {DEFAULT_STORE})")
    srv.add_argument("--corpus", nargs="+", metavar="SOURCE", help="corpus-rebuild sources (default: the config's "
                                                                   "corpus.sources, else builtin:enwiki)")
    srv.add_argument("--cron", help="corpus-rebuild schedule (default weekly: '0 3 * * 1')")
    srv.add_argument("--timezone", help="IANA time zone of --cron (default UTC), e.g. Europe/Berlin")
    srv.add_argument("--gpus", help="GPU ids, one GPU worker each with CUDA_VISIBLE_DEVICES set (default 0)")
    srv.add_argument("--serving", metavar="DIR", help="serve-release's export folder (default: `serving` beside a "
                                                      "local store, else in --home)")
    config.add_configuration(srv)
    srv.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    prefect_env.apply()  # quiet, offline Prefect unless the user configured otherwise; before Prefect is imported
    args = build_parser().parse_args(argv)
    from lexiflow.models.errors import LexiflowError
    from lexiflow.storage import StoreError

    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not at exit
        return status
    except (LexiflowError, StoreError) as exc:
        # One line whatever the message holds (a name with a newline or an escape code, from a source not quoted)
        print("error: " + printable(str(exc)), file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader stopped early (`| head`): stop quietly, as other CLIs do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python flushes stdout again at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a command a closed pipe stopped


def command() -> int:
    """The installed `lexiflow` command: `main` once the environment matches the checkout's lock."""
    from lexiflow.install_check import stale_install

    problem = stale_install()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return main()


if __name__ == "__main__":
    sys.exit(main())
