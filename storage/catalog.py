"""The catalog: what artifacts a store holds, the latest of a kind, lineage, and release aliases.

It is derived from the manifests themselves (a listing of `<root>/*/*/manifest.json`), not kept
in a separate index, so it is correct by construction when several runs publish at once: an
artifact is in the catalog exactly when its manifest exists. On object stores every listing
starts from the store itself, not the client's listing cache, so one catalog sees artifacts that
other processes or clients published after it was opened.

Aliases (`embeddings@production`) name the version downstream jobs read. An alias is its release
log, `<root>/.aliases/<kind>/<alias>/<seq>.json`: one immutable entry per move (from, to, when, why,
the flow run), each created exclusively under the next sequence number (`ArtifactStore.create_file`),
and the alias is the last entry's `to`. Two writers that move one alias at once both try the same
number; one creates it, the other reads the log again and appends after it, so no move is lost and
the alias always equals the log's last entry, on a local folder and an object store alike. After its entry, each
move writes the entry's head record (`<seq>.head`, created the same way): the log must reach the newest one, so a
deleted or altered last entry is damage, not an alias that silently names the version before.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from lexiflow.storage import releases
from lexiflow.storage.built_by import next_step
from lexiflow.storage.formats import DISTINGUISHED_BY  # noqa: F401  (re-exported: the catalog selects by it)
from lexiflow.storage.releases import ALIAS_PATTERN, ALIASES, Announce, Move, validate_alias  # noqa: F401  (re-exported)
from lexiflow.storage.store import (
    DEFAULT_ROOT,
    KIND_PATTERN,
    MANIFEST,
    VERSION_PATTERN,
    ArtifactDamaged,
    ArtifactNotFound,
    ArtifactRef,
    ArtifactStore,
    StoreError,
    repair_hint,
    retry_transient,
    validate_kind,
    validate_version,
)

log = logging.getLogger("lexiflow")

DEFAULT_ALIAS = "production"
_MOVE_ATTEMPTS = 1000  # each failed attempt means another writer moved the alias: progress, not a spin


def split_alias(spec: str) -> tuple[str, str | None]:
    """`KIND@NAME` → (kind, name); anything without '@' → (it, None). The one parse of alias references
    (the catalog, the loaders, the CLI and the flows' inputs all come here)."""
    if "@" not in spec:
        return spec, None
    kind, _, name = spec.partition("@")
    if not (KIND_PATTERN.fullmatch(kind) and ALIAS_PATTERN.fullmatch(name)):
        raise StoreError(f"{spec!r} is not an alias reference: write KIND@NAME, e.g. embeddings@production (NAME: "
                         "lowercase letters, digits, '_' and '-')")
    return kind, name


def release_command(kind: str, alias: str) -> str:
    """The command that moves `kind@alias`, for error messages."""
    return f"lexiflow release {kind}:VERSION" + ("" if alias == DEFAULT_ALIAS else f" --as {alias}")


def release_history(log: list[dict[str, Any]]) -> list[str]:
    """The versions an alias has named, as a stack replayed from its log: a release pushes its version, a
    rollback pops back to the one before. The alias names the last; a rollback returns to the one before it."""
    stack: list[str] = []
    for entry in log:
        if entry["action"] == "rollback":
            del stack[-1:]
        else:
            stack.append(entry["to"])
    return stack


class Catalog:
    """Read side of a store: `Catalog(root).latest("embeddings")`, `.get(kind, version)`, `.lineage(version)`.
    An artifact as a model object: `lexiflow.loaders.load(catalog, kind, version)`."""

    def __init__(self, root: str | os.PathLike[str] | ArtifactStore = DEFAULT_ROOT,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.store = root if isinstance(root, ArtifactStore) else ArtifactStore(root, storage_options)
        self.left_out: list[str] = []  # why the last `list` left artifacts out (damaged manifests)
        self._log_entries: dict[str, dict[str, Any]] = {}  # release log entries read, by path: they never change

    @retry_transient
    def entries(self, kind: str | None = None) -> list[tuple[str, str]]:
        """(kind, version) of every published artifact. Only `<kind>/<version>/manifest.json` with
        valid names counts: a writer's staging folder (`.staging/...`, which holds a manifest just
        before its atomic rename) is never visible to readers."""
        fs, root = self.store.fs, self.store.root
        self.store.refresh()  # an object store's cached listing would miss what others published since
        pattern = f"{root}/{validate_kind(kind) if kind else '*'}/*/{MANIFEST}"
        found = []
        for path in fs.glob(pattern):
            found_kind, found_version = path.rsplit("/", 3)[-3:-1]
            if KIND_PATTERN.fullmatch(found_kind) and VERSION_PATTERN.fullmatch(found_version):
                found.append((found_kind, found_version))
        return sorted(found)

    def list(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Manifests, oldest first, each with its `path` added. An artifact whose manifest cannot be
        read (damaged, or deleted meanwhile) is left out with a warning: it is no artifact to use,
        and one must not hide the others (`lexiflow artifacts verify` reports it)."""
        manifests, self.left_out = [], []
        for found_kind, version in self.entries(kind):
            try:
                manifest = self.store.manifest(found_kind, version)
            except StoreError as exc:
                log.warning("left out of the catalog: %s", exc)
                self.left_out.append(str(exc))
                continue
            manifest.update(kind=found_kind, version=version, path=self.store.location(found_kind, version))
            manifests.append(manifest)
        return sorted(manifests, key=lambda m: (str(m.get("created", "")), m["kind"], m["version"]))

    def kinds(self) -> list[str]:
        return sorted({m["kind"] for m in self.list()})

    def latest(self, kind: str, /, **selector: Any) -> dict[str, Any] | None:
        """The newest manifest of a kind, among those whose metrics match `selector`, e.g.
        `latest("embeddings", method="glove")`, `latest("tokenizer", kind="bpe")`, `latest("lm", model="lstm")`,
        `latest("tagger", column="upos")` (one run publishes several artifacts of a kind: `DISTINGUISHED_BY`)."""
        found = [m for m in self.list(kind) if all(m["metrics"].get(k) == v for k, v in selector.items())]
        return found[-1] if found else None

    def get(self, kind: str, version: str | None = None, /, **selector: Any) -> dict[str, Any]:
        """A manifest by kind and version (the latest of the kind, matching `selector`, when version is None),
        or by alias: `get("embeddings@production")`, or `get("embeddings", "embeddings@production")` where the
        kind is known (a flow's input, a CLI option)."""
        kind, version, alias = self.resolve(kind, version)
        if alias is not None:
            try:
                manifest = self.store.manifest(kind, version)
            except ArtifactNotFound:
                raise ArtifactNotFound(f"{kind}@{alias} names {kind}:{version}, which is no longer in {self.store.url} "
                                       f"(removed); release another version: {release_command(kind, alias)}") from None
            manifest["path"] = self.store.location(kind, version)
            return manifest
        if version is None:
            manifest = self.latest(kind, **selector)
            if manifest is None:
                which = "".join(f" with {k}={v}" for k, v in selector.items())
                raise ArtifactNotFound(f"no {kind} artifact{which} in {self.store.url}; "
                                       f"{next_step(kind, self.store.url, selector)}")
            return manifest
        try:
            manifest = self.store.manifest(kind, validate_version(version))
        except ArtifactNotFound as exc:
            raise ArtifactNotFound(f"{exc}; `lexiflow artifacts list --kind {kind} --store {self.store.url}` shows "
                                   f"the versions there, or {next_step(kind, self.store.url)}") from None
        manifest["path"] = self.store.location(kind, version)
        return manifest

    def resolve(self, kind: str, version: str | None = None) -> tuple[str, str | None, str | None]:
        """(kind, version, alias) a reference names: `KIND` with a version or None (the latest), `KIND@NAME`,
        or a kind with `KIND@NAME` as its version; an alias is resolved to the version it names, and an
        unknown one is a StoreError saying how to release one."""
        kind, alias = split_alias(kind)
        if alias is not None and version is not None:
            raise StoreError(f"{kind}@{alias} {version}: give an alias or a version, not both")
        if version is not None and "@" in version:
            named, alias = split_alias(version)
            if named != kind:
                raise StoreError(f"{version} names a {named} artifact where a {kind} one is wanted; give "
                                 f"{kind}@{alias} or a {kind} version")
        validate_kind(kind)
        if alias is None:
            return kind, version, None
        released = self.released(kind, alias)
        if released is None:
            raise StoreError(f"no alias {alias!r} for {kind} in {self.store.url}; release a version first: "
                             f"{release_command(kind, alias)}")
        return kind, released, alias

    def find(self, version: str) -> dict[str, Any]:
        """The manifest of a version, whatever its kind."""
        validate_version(version)
        self.store.refresh()
        matches = self.store.fs.glob(f"{self.store.root}/*/{version}/{MANIFEST}")
        if not matches:
            raise ArtifactNotFound(f"no artifact with version {version} in {self.store.url}; "
                                   f"{next_step('', self.store.url)}")
        return self.get(matches[0].rsplit("/", 3)[-3], version)

    def ref(self, kind: str, version: str | None = None, /, **selector: Any) -> ArtifactRef:
        manifest = self.get(kind, version, **selector)
        return self.store.ref(manifest["kind"], manifest["version"])

    def lowercased(self, manifest: dict[str, Any]) -> bool:
        """Whether the corpus an artifact (a tokenizer) was made from is lowercased: the corpus stage
        lowercases (or not) before any tokenizer sees the text, so text meant for it must match."""
        corpus = manifest["inputs"].get("corpus")
        if corpus is None or not self.store.exists("corpus", corpus["version"]):
            return False
        return bool(self.store.manifest("corpus", corpus["version"])["parameters"].get("params", {}).get("lowercase"))

    def lineage(self, version: str, kind: str | None = None) -> dict[str, Any]:
        """The artifact and, recursively, the artifacts it was made from (inputs are looked up by
        kind and version: one manifest read each, no listing)."""
        try:
            manifest = self.find(version) if kind is None else self.get(kind, version)
        except ArtifactNotFound:  # removed (`lexiflow artifacts rm --force`): a run that needs it rebuilds it
            return {"kind": kind, "version": version, "missing": True}
        return {
            "kind": manifest["kind"],
            "version": manifest["version"],
            "parameters": manifest["parameters"],
            "inputs": {name: self.lineage(ref["version"], ref["kind"]) for name, ref in manifest["inputs"].items()},
        }

    # ---- whole-store views ----------------------------------------------------------------
    def dependents(self, kind: str, version: str) -> list[str]:
        """`kind:version` of every artifact built directly from `kind:version` (their manifests' inputs)."""
        return [f"{m['kind']}:{m['version']}" for m in self.list()
                if any((ref["kind"], ref["version"]) == (kind, version) for ref in m["inputs"].values())]

    def unreferenced(self, keep: int) -> list[tuple[str, str]]:
        """(kind, version) of the artifacts a keep-last-`keep` policy removes, newest first: kept are
        the `keep` newest of each kind (by `created`), so the latest reports too, every version an alias
        names and the one its rollback returns to (`protected`), and everything a kept artifact was built
        from, transitively (a report's whole lineage). Artifacts whose manifest cannot be read are not
        listed: `verify` reports them, `rm` removes them."""
        if keep < 1:
            raise StoreError(f"keep={keep}: keep at least the newest artifact of each kind")
        manifests = self.list()  # oldest first
        inputs = {(m["kind"], m["version"]): [(r["kind"], r["version"]) for r in m["inputs"].values()]
                  for m in manifests}
        kept = self.protected()
        for kind in {m["kind"] for m in manifests}:
            kept.update([key for key in inputs if key[0] == kind][-keep:])
        todo = list(kept)
        while todo:
            for ref in inputs.get(todo.pop(), []):
                if ref not in kept:
                    kept.add(ref)
                    todo.append(ref)
        return [key for key in reversed(list(inputs)) if key not in kept]

    def audit(self, full: bool = False) -> tuple[int, list[str]]:
        """(artifacts checked, problems) over the whole store: every manifest must parse and every
        file it lists must match (sizes; checksums with `full`); every release log entry must parse, and
        every alias name an artifact in the store. Used by `lexiflow artifacts verify`."""
        checked, problems = 0, []
        for kind, version in self.entries():
            checked += 1
            try:
                problems.extend(self.store.verify(kind, version, full=full))
            except StoreError as exc:
                problems.append(str(exc))
        problems += self._alias_problems()
        return checked, problems

    def _alias_problems(self) -> list[str]:
        """Everything wrong with the release logs and the transactions in the store (see `audit`)."""
        scan = releases.scan(self.store)
        problems = [problem for _, problem in scan.problems]
        hidden = releases.hidden(self.store)
        for kind, alias in scan.aliases():
            try:
                entries = [self._read_entry(path) for _, path in scan.files.get((kind, alias), [])]
            except StoreError as exc:
                problems.append(str(exc))
                continue
            broken = releases.chain_problems(entries, self._alias_folder(kind, alias))
            if not broken and self._head_problem(kind, alias, scan, entries):
                try:  # confirmed by fresh listings: a mover may have written an entry and its record since this one
                    entries = self.full_log(kind, alias)
                except StoreError as exc:
                    broken = [] if str(exc) in problems else [str(exc)]
            problems += broken
            visible = [e for e in entries if e.get("tx") not in hidden]
            if broken or not visible:
                continue
            if not self.store.exists(kind, visible[-1]["to"]):
                problems.append(f"{kind}@{alias} names {kind}:{visible[-1]['to']}, which is not in the store; release "
                                f"another version: {release_command(kind, alias)}")
        for tx in sorted(releases.pending(self.store)):
            try:
                releases.read_intent(self.store, tx)
            except StoreError as exc:
                problems.append(str(exc))
        return problems

    # ---- aliases and the release log --------------------------------------------------------
    def release(self, kind: str, version: str, alias: str = DEFAULT_ALIAS, *, reason: str = "",
                flow_run: Any = None, announce: Announce | None = None) -> dict[str, Any]:
        """Point `kind@alias` at `kind:version` and append the move to the release log; returns the log
        entry. A release of the version the alias already names writes nothing and returns the entry that moved
        it there, with `unchanged: True`. `announce(entry, payload)` sends the move's event (storage/releases.py)."""
        return self.release_many([(kind, version, alias)], reason=reason, flow_run=flow_run, announce=announce)[0]

    def release_many(self, moves: list[tuple[str, str, str]], *, reason: str = "", flow_run: Any = None,
                     payload: dict[str, Any] | None = None, announce: Announce | None = None) -> list[dict[str, Any]]:
        """Move several aliases, [(kind, version, alias)], as one: readers see all of them moved or none, also
        when the mover dies midway (the next mover or deleter completes it). One entry per move, as `release`."""
        checked = []
        for kind, version, alias in moves:
            validate_kind(kind), validate_version(version), validate_alias(alias)
            checked.append(Move(kind, alias, "release", version))
        return releases.transact(self, checked, reason=reason, flow_run=flow_run, payload=payload, announce=announce)

    def rollback(self, kind: str, alias: str = DEFAULT_ALIAS, *, reason: str = "",
                 flow_run: Any = None, announce: Announce | None = None) -> dict[str, Any]:
        """Move `kind@alias` back one release (to the version it named before the current one) and log it.
        If another writer moves the alias meanwhile, nothing is written: roll back what you have seen."""
        validate_kind(kind), validate_alias(alias)
        return releases.transact(self, [Move(kind, alias, "rollback")], reason=reason, flow_run=flow_run,
                                 announce=announce)[0]

    def rollback_target(self, kind: str, alias: str, log: list[dict[str, Any]]) -> str:
        """The version a rollback of `kind@alias`, whose log is `log`, returns to (a StoreError if none)."""
        history = release_history(log)
        if not history:
            raise StoreError(f"no alias {alias!r} for {kind} in {self.store.url}; nothing to roll back")
        if len(history) < 2:
            raise StoreError(f"{kind}@{alias} names {history[-1]}, its first release: no earlier version to roll back "
                             "to")
        if not self.store.exists(kind, history[-2]):
            raise StoreError(f"{kind}@{alias}: the version before, {kind}:{history[-2]}, is no longer in "
                             f"{self.store.url}; release another version: {release_command(kind, alias)}")
        return history[-2]

    def check_releasable(self, kind: str, version: str) -> None:
        """A version a move may name: in the store, and its files as its manifest says."""
        if not self.store.exists(kind, version):
            raise ArtifactNotFound(f"no artifact {kind}:{version} in {self.store.url}; `lexiflow artifacts list "
                                   f"--kind {kind}` shows the versions there")
        if problems := self.store.verify(kind, version):  # sizes: one listing; downstream jobs would read it
            raise ArtifactDamaged(f"not released: {problems[0]}; {repair_hint(kind, version)}")

    def released(self, kind: str, alias: str = DEFAULT_ALIAS) -> str | None:
        """The version `kind@alias` names (the last entry of its log), None if never released."""
        log = self.visible_log(validate_kind(kind), validate_alias(alias))
        return log[-1]["to"] if log else None

    def release_log(self, kind: str, alias: str | None = None, *, pending: bool = False) -> list[dict[str, Any]]:
        """The moves of a kind's aliases (of one alias with `alias`), per alias in sequence order, each entry
        with `kind`, `alias`, `seq`, `action` (release or rollback), `from` (None for the first), `to`,
        `at` (UTC, ISO-8601), `reason` and `flow_run` (and `tx`, the transaction that made it). The moves of a
        transaction not committed yet are there only with `pending`. A damaged log is a StoreError naming the file."""
        validate_kind(kind)
        names = [validate_alias(alias)] if alias is not None else sorted(name for _, name in self._logs(kind))
        read = self.full_log if pending else self.visible_log
        return [entry for name in names for entry in read(kind, name)]

    def visible_log(self, kind: str, alias: str) -> list[dict[str, Any]]:
        """The log of `kind@alias` as readers see it (`release_log`)."""
        hidden = releases.hidden(self.store)
        return [entry for entry in self.full_log(kind, alias) if entry.get("tx") not in hidden]

    def tx_entries(self, kind: str, alias: str, tx: str) -> list[dict[str, Any]]:
        """The entries of `kind@alias` the transaction `tx` wrote."""
        return [entry for entry in self.full_log(kind, alias) if entry.get("tx") == tx]

    def aliases(self, kind: str | None = None) -> dict[str, dict[str, str]]:
        """kind -> {alias: version} for every alias in the store (of one kind with `kind`)."""
        found: dict[str, dict[str, str]] = {}
        for found_kind, alias in self._logs(kind and validate_kind(kind)):
            if version := self.released(found_kind, alias):
                found.setdefault(found_kind, {})[alias] = version
        return found

    def protected(self) -> set[tuple[str, str]]:
        """(kind, version) of what `gc` must keep whatever its age: every alias's version, the one a rollback
        would return to, and every version a pending release moves an alias to."""
        kept = releases.pending_versions(self.store)
        for kind, alias in self._logs():
            kept.update((kind, version) for version in release_history(self.visible_log(kind, alias))[-2:])
        return kept

    def append_move(self, move: Move, reason: str, flow_run: Any, tx: str | None = None) -> dict[str, Any] | None:
        """Append `move` to the log of its alias, created exclusively under the next number; when another writer
        created that number first, read again and retry. None when there is nothing to write: a release to the
        version the alias names. A rollback whose alias moved from `move.expect` meanwhile is a StoreError."""
        kind, alias = move.kind, move.alias
        for _ in range(_MOVE_ATTEMPTS):
            # One read, uncommitted moves included (a move under way is a move: it is completed, never undone).
            entries = self.release_log(kind, alias, pending=True)
            head = entries[-1]["to"] if entries else None
            if move.action == "release" and head == move.to:
                return None  # already there: not a move
            if move.action == "rollback" and head != move.expect:
                raise StoreError(f"{kind}@{alias} moved to {head} while rolling back {move.expect}; nothing rolled "
                                 "back, check the release log and try again")
            last = entries[-1] if entries else None
            entry = {"kind": kind, "alias": alias, "seq": last["seq"] + 1 if last else 1, "action": move.action,
                     "from": last and last["to"], "to": move.to, "at": dt.datetime.now(dt.UTC).isoformat(),
                     "reason": reason, "flow_run": flow_run, **({"tx": tx} if tx else {})}
            data = json.dumps(entry, indent=2, default=str).encode()
            if self.store.create_file(f"{self._alias_folder(kind, alias)}/{releases.entry_name(entry['seq'])}", data):
                log.info("%s@%s: %s -> %s (%s)", kind, alias, entry["from"], move.to, move.action)
                return json.loads(data)
        raise StoreError(f"{kind}@{alias}: the release log kept moving under {_MOVE_ATTEMPTS} attempts; try again")

    def _alias_folder(self, kind: str, alias: str | None = None) -> str:
        return "/".join([self.store.root, ALIASES, kind, *([alias] if alias else [])])

    def _logs(self, kind: str | None = None) -> list[tuple[str, str]]:
        """(kind, alias) of every release log (of one kind), from one listing; damage is a StoreError."""
        scan = releases.scan(self.store, kind)
        if damage := scan.damage(kind):
            raise StoreError(damage)
        return scan.aliases()

    def full_log(self, kind: str, alias: str) -> list[dict[str, Any]]:
        """Every entry of the log of `kind@alias`, committed or not, checked: its files, each entry against its
        path, the chain, the newest head record. Damage is a StoreError naming the file."""
        entries, problem = self._checked_log(kind, alias)
        if problem:  # the listing may have caught a mover between its entry and its head record: list once more
            entries, problem = self._checked_log(kind, alias)
        if problem:
            raise StoreError(problem)
        return entries

    def _checked_log(self, kind: str, alias: str) -> tuple[list[dict[str, Any]], str | None]:
        """`full_log`'s entries from one listing, and what the newest head record says is wrong with them."""
        scan = releases.scan(self.store, kind, alias)
        if damage := scan.damage(kind, alias):
            raise StoreError(damage)
        entries = [self._read_entry(path) for _, path in scan.files.get((kind, alias), [])]
        if broken := releases.chain_problems(entries, self._alias_folder(kind, alias)):
            raise StoreError(broken[0])
        return entries, self._head_problem(kind, alias, scan, entries)

    def _head_problem(self, kind: str, alias: str, scan: releases.LogScan, entries: list[dict[str, Any]]) -> str | None:
        """What the newest head record of `kind@alias` says is wrong with its entries (releases.head_problem)."""
        if not (heads := scan.heads.get((kind, alias))):
            return None  # a log from before head records, or whose mover died before its first one
        path = heads[-1][1]
        try:
            head = self._read_entry(path)
        except StoreError as exc:
            return str(exc)
        return releases.head_problem(head, path, entries, self._alias_folder(kind, alias))

    def write_head(self, entry: dict[str, Any]) -> None:
        """Write the head record of a log entry just appended (or found without one by `settle`)."""
        folder = self._alias_folder(entry["kind"], entry["alias"])
        self.store.create_file(f"{folder}/{releases.head_name(entry['seq'])}", releases.head_record(entry))

    def _read_entry(self, path: str) -> dict[str, Any]:
        if path not in self._log_entries:
            self._log_entries[path] = self._load_entry(path)
        return dict(self._log_entries[path])

    @retry_transient
    def _load_entry(self, path: str) -> dict[str, Any]:
        """A log entry or (`.head`) a head record, checked against its path."""
        head = path.endswith(".head")
        try:
            with self.store.fs.open(path, "r") as f:
                entry = json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:  # entries are created whole: only tampering does this
            what = "release log head record" if head else "release log entry"
            raise StoreError(f"{what} {path}: not valid JSON ({exc}); restore it from a backup") from None
        return releases.check_head(entry, path) if head else releases.check_entry(entry, path)
