"""Release logs read with their damage named, and alias moves made as transactions with an outbox.

The release log of `kind@alias` is `<root>/.aliases/<kind>/<alias>/<seq>.json` (storage/catalog.py). Reading it here
names what is wrong instead of skipping it (`scan`, `check_entry`, `chain_problems`): a file or link where a folder
should be, a file the reader would not read, an entry whose fields disagree with its path, a `to` that is not a
version, a gap or break in the chain, a last entry deleted or altered after its head record (`<seq>.head`, written
after each entry: `head_problem`). Readers of a damaged alias fail with one line naming the file; `verify` reports
every case.

Every alias move (a release, a rollback, all the aliases a flow run moves at once) is a transaction:
1. its intent, `<root>/.releases/<id>.json` (the moves, created exclusively) — on a local store the mover holds an
   OS lock on `<id>.lock` beside it while it lives;
2. one log entry per move, each carrying the transaction's `tx` id, then its head record: readers do not see entries
   of a transaction that has an intent and no commit, so a reader sees all of its moves or none;
3. the commit, `<id>.commit`: from now on every move is visible;
4. the events (`announce`, one per move), then the intent and the commit are removed: the drained outbox.
A transaction whose mover died (its lock free on a local store; on an object store its intent older than
`STALE_SECONDS`) is completed by the next mover or deleter (`settle`): the moves not yet in their logs are appended
(a rollback only if the alias still names what it rolled back), the missing head records written, it is committed,
and its events are sent. A command that cannot send events (no Prefect server configured) leaves committed
transactions in place, as the outbox the next one that can drains; an event may so be sent twice (a crash between
sending and draining), never not at all.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lexiflow.storage.locks import lease_held, store_lock, wait_for_no_lease
from lexiflow.storage.store import (
    KIND_PATTERN,
    VERSION_PATTERN,
    ArtifactStore,
    StoreError,
    held_lock_file,
    retry_transient,
)

ALIASES = ".aliases"  # <root>/.aliases/<kind>/<alias>/<seq>.json: the release log, one file per move
TRANSACTIONS = ".releases"  # <root>/.releases/<id>.json (intent), <id>.commit, <id>.lock (local: the live mover)
ALIAS_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
LOG_FILE = re.compile(r"^([0-9]{8,})\.(json|head)$")  # zero-padded to 8 digits, more past 99999999: sorted as numbers
STALE_SECONDS = 600.0  # an object store's intent older than this was left by a killed mover
STEP: Callable[[str], None] | None = None  # called at each step of a transaction (tests kill a mover there)
Announce = Callable[[dict[str, Any], dict[str, Any]], None]  # (log entry, payload): emit its event


def validate_alias(name: str) -> str:
    if not isinstance(name, str) or not ALIAS_PATTERN.fullmatch(name):
        raise StoreError(f"invalid alias name {name!r}: use lowercase letters, digits, '_' and '-', starting with a "
                         "letter (e.g. production)")
    return name


def entry_name(seq: int) -> str:
    return f"{seq:08d}.json"


def head_name(seq: int) -> str:
    """The head record of entry `seq`: written after the entry, it witnesses that the log reached it (a deleted last
    entry would otherwise read as an alias that never made that move)."""
    return f"{seq:08d}.head"


def _step(name: str) -> None:
    if STEP is not None:
        STEP(name)


# ---- reading the logs, damage named ----------------------------------------------------------
@dataclass
class LogScan:
    """What is under `.aliases` (or one kind's or alias's part of it): each alias's entries and head records in
    sequence order, and the damage found. A problem's scope says which readers it stops: () every one, (kind,) those
    of that kind, (kind, alias) those of that alias, None none (only `verify` reports it)."""

    files: dict[tuple[str, str], list[tuple[int, str]]] = field(default_factory=dict)
    heads: dict[tuple[str, str], list[tuple[int, str]]] = field(default_factory=dict)
    problems: list[tuple[tuple[str, ...] | None, str]] = field(default_factory=list)

    def damage(self, kind: str | None = None, alias: str | None = None) -> str | None:
        """The first problem that stops a reader of `kind@alias` (of a whole kind, of every alias with None)."""
        wanted = tuple(name for name in (kind, alias) if name is not None)
        for scope, problem in self.problems:
            if scope is not None and (scope[:len(wanted)] == wanted or wanted[:len(scope)] == scope):
                return problem
        return None

    def aliases(self) -> list[tuple[str, str]]:
        """(kind, alias) of every log found, also one whose entries are all gone but a head record."""
        return sorted({*self.files, *self.heads})


def _type(store: ArtifactStore, path: str) -> str | None:
    """'directory', 'file', 'link' or None (missing), without following a link."""
    if store.is_local:
        try:
            return _local_type(os.lstat(path).st_mode)
        except FileNotFoundError:
            return None
    try:
        return store.fs.info(path)["type"]
    except FileNotFoundError:
        return None


def _tree(store: ArtifactStore, top: str) -> list[tuple[tuple[str, ...], str]]:
    """Every path under the folder `top` (relative parts) and its type; links are listed, never followed."""
    if not store.is_local:
        found = store.fs.find(top, withdirs=True, detail=True)
        return [(tuple(path[len(top) + 1:].split("/")), info["type"]) for path, info in sorted(found.items())
                if path.rstrip("/") != top]
    found = []
    for folder, folders, names in os.walk(top, followlinks=False):
        for name in sorted(folders + names):
            path = os.path.join(folder, name)
            with suppress(FileNotFoundError):  # removed by a mover meanwhile: not there
                found.append((tuple(os.path.relpath(path, top).split(os.sep)), _local_type(os.lstat(path).st_mode)))
    return found


def _local_type(mode: int) -> str:
    """The type of a path from one `lstat`: two looks (is it a folder? does it exist?) would call a folder another
    mover creates between them a file."""
    return "link" if stat.S_ISLNK(mode) else "directory" if stat.S_ISDIR(mode) else "file"


def _not_a_folder(path: str, kind: str) -> str:
    what = "a symbolic link" if kind == "link" else "a file"
    return f"{path}: {what} where the release logs keep a folder; restore the folder from a backup"


@retry_transient
def scan(store: ArtifactStore, kind: str | None = None, alias: str | None = None) -> LogScan:
    """The release logs under `.aliases` (one kind's, one alias's), with their damage (see `LogScan`)."""
    store.refresh()
    result, names = LogScan(), [name for name in (kind, alias) if name is not None]
    base = f"{store.root}/{ALIASES}"
    for depth in range(len(names) + 1):  # the folders down to the one read: each must be a folder or missing
        path = "/".join([base, *names[:depth]])
        found = _type(store, path)
        if found is None:
            return result
        if found != "directory":
            result.problems.append((tuple(names[:depth]), _not_a_folder(path, found)))
            return result
    top = "/".join([base, *names])
    for parts, found in _tree(store, top):
        parts = (*names, *parts)
        path = "/".join([base, *parts])
        valid = [KIND_PATTERN, ALIAS_PATTERN][:len(parts)]
        if len(parts) <= 2:
            if not all(p.fullmatch(name) for p, name in zip(valid, parts, strict=False)):
                result.problems.append((None, f"{path}: not a kind or alias name; the release logs' reader skips "
                                              "it (remove it)"))
            elif found != "directory":
                result.problems.append((parts, _not_a_folder(path, found)))
        elif len(parts) == 3 and KIND_PATTERN.fullmatch(parts[0]) and ALIAS_PATTERN.fullmatch(parts[1]):
            match = LOG_FILE.fullmatch(parts[2])
            if match and found == "file" and f"{int(match[1]):08d}.{match[2]}" == parts[2]:
                found_in = result.files if match[2] == "json" else result.heads
                found_in.setdefault(parts[:2], []).append((int(match[1]), path))
            elif found == "link" or (match and found == "directory"):
                what = "a symbolic link" if found == "link" else "a folder"
                result.problems.append((parts[:2], f"{path}: {what}, not a release log entry; restore the entry "
                                                   "from a backup"))
            else:
                result.problems.append((None, f"{path}: not a release log entry (NNNNNNNN.json); the reader skips "
                                              "it (remove it)"))
    for entries in (*result.files.values(), *result.heads.values()):
        entries.sort()
    return result


def check_entry(entry: Any, path: str) -> dict[str, Any]:
    """A log entry read from `path` (`.aliases/<kind>/<alias>/<seq>.json`), checked against its path."""
    kind, alias, name = path.rsplit("/", 3)[-3:]

    def bad(why: str) -> StoreError:
        return StoreError(f"release log entry {path}: {why}; restore it from a backup")

    if not (isinstance(entry, dict) and entry.get("action") in ("release", "rollback")
            and isinstance(entry.get("seq"), int) and not isinstance(entry.get("seq"), bool)):
        raise bad("not a release log entry")
    for key, value in (("kind", kind), ("alias", alias)):
        if entry.get(key) != value:
            raise bad(f"its {key} {entry.get(key)!r} is not its folder's {value!r}")
    if entry_name(entry["seq"]) != name:
        raise bad(f"its seq {entry['seq']} is not its file name's")
    for key in ("to", "from"):
        value = entry.get(key)
        if not (isinstance(value, str) and VERSION_PATTERN.fullmatch(value)) and not (key == "from" and value is None):
            raise bad(f"its {key!r} {value!r} is not a version (16 hexadecimal digits)")
    return entry


def digest(entry: dict[str, Any]) -> str:
    """An entry's fingerprint, over its fields (not its file's bytes): what its head record holds."""
    return hashlib.sha256(json.dumps(entry, sort_keys=True, default=str).encode()).hexdigest()


def head_record(entry: dict[str, Any]) -> bytes:
    """The head record of a log entry; the same bytes whoever writes it (the mover, or `settle` after its crash)."""
    return json.dumps({"seq": entry["seq"], "to": entry["to"], "sha256": digest(entry)}).encode()


def check_head(record: Any, path: str) -> dict[str, Any]:
    """A head record read from `path` (`.aliases/<kind>/<alias>/<seq>.head`), checked against its path."""
    if not (isinstance(record, dict) and type(record.get("seq")) is int and record["seq"] >= 1
            and head_name(record["seq"]) == path.rsplit("/", 1)[-1]
            and isinstance(record.get("sha256"), str) and VERSION_PATTERN.fullmatch(str(record.get("to")))):
        raise StoreError(f"release log head record {path}: not a head record; restore it from a backup")
    return record


def head_problem(head: dict[str, Any], path: str, entries: list[dict[str, Any]], folder: str) -> str | None:
    """What a log's newest head record `head` says is wrong with its (chain-checked) `entries`: the entry it names
    is missing (deleted: the alias would silently name an older version) or altered. An entry newer than the head
    record is no damage: its mover died before writing the record."""
    seq = head["seq"]
    if seq > len(entries):
        return (f"{folder}/{entry_name(seq)}: missing (its head record {path} says the log reached #{seq}, moving "
                f"the alias to {head['to']}; the log ends at #{len(entries)}); restore it from a backup")
    if digest(entries[seq - 1]) != head["sha256"]:
        return (f"release log entry {folder}/{entry_name(seq)}: changed since its head record {path} was written "
                "(the fields differ); restore it from a backup")
    return None


def chain_problems(entries: list[dict[str, Any]], folder: str) -> list[str]:
    """Where a log's chain is broken: a number missing, or an entry's `from` not the `to` before it."""
    problems, before = [], None
    for expected, entry in enumerate(entries, 1):
        if entry["seq"] != expected:
            problems.append(f"{folder}/{entry_name(expected)}: missing (the release log jumps from #{expected - 1} "
                            f"to #{entry['seq']}); restore it from a backup")
            break
        if entry["from"] != (before and before["to"]):
            problems.append(f"release log entry {folder}/{entry_name(entry['seq'])}: moves from {entry['from']}, but "
                            f"the entry before moved it to {before and before['to']}; the chain is broken, restore the "
                            "log from a backup")
            break
        before = entry
    return problems


# ---- transactions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    """One alias move of a transaction: `to` is the version (a rollback's is decided when it starts), `expect` the
    version the alias named when it started (a rollback moves only if it still does)."""

    kind: str
    alias: str
    action: str = "release"
    to: str | None = None
    expect: str | None = None


def _folder(store: ArtifactStore) -> str:
    return f"{store.root}/{TRANSACTIONS}"


@retry_transient
def pending(store: ArtifactStore) -> dict[str, bool]:
    """{transaction id: committed} of every transaction with an intent in the store."""
    store.refresh()
    folder = _folder(store)
    if _type(store, folder) != "directory":
        return {}
    names = {path.rstrip("/").rsplit("/", 1)[-1] for path in store.fs.ls(folder, detail=False)}
    return {name.removesuffix(".json"): f"{name.removesuffix('.json')}.commit" in names
            for name in names if name.endswith(".json")}


def hidden(store: ArtifactStore) -> set[str]:
    """Transactions whose entries readers do not see yet: an intent and no commit."""
    return {tx for tx, committed in pending(store).items() if not committed}


def read_intent(store: ArtifactStore, tx: str) -> dict[str, Any] | None:
    path = f"{_folder(store)}/{tx}.json"
    try:
        with store.fs.open(path, "r") as f:
            intent = json.load(f)
    except FileNotFoundError:
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"release intent {path}: not valid JSON ({exc}); restore it or remove it") from None
    if not (isinstance(intent, dict) and isinstance(intent.get("moves"), list)):
        raise StoreError(f"release intent {path}: not a release intent; restore it or remove it")
    return intent


def pending_versions(store: ArtifactStore) -> set[tuple[str, str]]:
    """(kind, version) every transaction not committed yet moves an alias to: a deleter keeps them (once committed,
    its moves are in the logs, which the deleter reads)."""
    found = set()
    for tx in hidden(store):
        for move in (read_intent(store, tx) or {}).get("moves", []):
            found.add((move["kind"], move["to"]))
    return found


class _Transaction:
    def __init__(self, store: ArtifactStore, tx: str) -> None:
        self.store, self.id = store, tx

    def path(self, suffix: str) -> str:
        return f"{_folder(self.store)}/{self.id}{suffix}"

    def commit(self) -> None:
        self.store.create_file(self.path(".commit"), b"{}")

    def drain(self) -> None:
        """The intent first: a commit without an intent hides nothing, an intent without its commit would."""
        for suffix in (".json", ".commit"):
            with suppress(FileNotFoundError):
                self.store.fs.rm(self.path(suffix))


@contextmanager
def _begun(store: ArtifactStore, moves: list[Move], reason: str, flow_run: Any,
           payload: dict[str, Any]) -> Iterator[_Transaction]:
    """A transaction with its intent written (and, locally, its lock held while the block runs)."""
    now = dt.datetime.now(dt.UTC)
    tx = _Transaction(store, f"{now:%Y%m%dT%H%M%S%f}-{os.urandom(4).hex()}")
    intent = {"id": tx.id, "at": now.isoformat(), "reason": reason, "flow_run": flow_run, "payload": payload,
              "moves": [vars(m) for m in moves]}
    data = json.dumps(intent, indent=2, default=str).encode()
    if store.is_local:
        Path(_folder(store)).mkdir(parents=True, exist_ok=True)
        with held_lock_file(Path(tx.path(".lock"))):
            store.create_file(tx.path(".json"), data)
            yield tx
        return
    store.create_file(tx.path(".json"), data)
    yield tx


def _abandon(tx: _Transaction) -> None:
    """Nothing of it was written: remove its intent."""
    with suppress(FileNotFoundError):
        tx.store.fs.rm(tx.path(".json"))


def transact(catalog: Any, moves: list[Move], *, reason: str = "", flow_run: Any = None,
             payload: dict[str, Any] | None = None, announce: Announce | None = None) -> list[dict[str, Any]]:
    """Make `moves` as one transaction (see the module's docstring); returns each move's log entry, or for a
    release of the version the alias names already, its last entry with `unchanged: True` (nothing written)."""
    store, payload = catalog.store, dict(payload or {})
    with store_lock(store, exclusive=False):
        settle(catalog, announce)
        results: list[dict[str, Any] | None] = [None] * len(moves)
        todo: list[tuple[int, Move]] = []
        for i, move in enumerate(moves):
            log = catalog.full_log(move.kind, move.alias)  # a move under way is a move
            head = log[-1]["to"] if log else None
            if move.action == "rollback":
                move = replace(move, to=catalog.rollback_target(move.kind, move.alias, log), expect=head)
            elif head == move.to:
                results[i] = {**log[-1], "unchanged": True}
                continue
            todo.append((i, replace(move, expect=head)))
        while todo:
            with _begun(store, [m for _, m in todo], reason, flow_run, payload) as tx:
                if not store.is_local and lease_held(store):  # a deleter at work: let it finish, then again
                    _abandon(tx)
                    wait_for_no_lease(store)
                    continue
                _step("intent")
                written = []
                try:
                    for i, move in todo:
                        catalog.check_releasable(move.kind, move.to)  # after the intent: no deleter takes it now
                        entry = catalog.append_move(move, reason, flow_run, tx.id)
                        results[i] = entry if entry is not None else {**catalog.full_log(move.kind, move.alias)[-1],
                                                                      "unchanged": True}
                        written += [entry] if entry is not None else []
                        _step(f"entry-{len(written)}")  # a crash here leaves an entry without its head record
                        if entry is not None:
                            catalog.write_head(entry)
                except StoreError:
                    if written:
                        raise  # its intent stays: the next mover or deleter completes it
                    _abandon(tx)
                    raise
                tx.commit()
                _step("commit")
                if announce is not None:
                    _announce(written, payload, announce)
                    tx.drain()
            break
    return [dict(result) for result in results if result is not None]


def _announce(entries: list[dict[str, Any]], payload: dict[str, Any], announce: Announce) -> None:
    for n, entry in enumerate(entries, 1):
        announce(entry, payload)
        _step(f"announced-{n}")


@contextmanager
def _claimed(store: ArtifactStore, tx: str) -> Iterator[bool]:
    """Whether the transaction `tx` is this caller's to complete: its mover died (and no other caller claims it)."""
    if not store.is_local:
        intent = read_intent(store, tx)
        at = dt.datetime.fromisoformat(intent["at"]).timestamp() if intent and "at" in intent else 0.0
        yield intent is not None and time.time() - at >= STALE_SECONDS
        return
    path = Path(f"{_folder(store)}/{tx}.lock")
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False  # its mover lives
            return
        yield read_intent(store, tx) is not None
        path.unlink(missing_ok=True)


def settle(catalog: Any, announce: Announce | None) -> None:
    """Complete the transactions of dead movers and, with `announce`, send the events the outbox holds."""
    store = catalog.store
    for tx, committed in sorted(pending(store).items()):
        if committed and announce is None:
            continue  # moved and visible; its events wait for a command that can send them
        with _claimed(store, tx) as mine:
            if not mine:
                continue
            intent = read_intent(store, tx)
            moves = [Move(**move) for move in intent["moves"]]
            if not committed:
                for move in moves:
                    if not catalog.tx_entries(move.kind, move.alias, tx):
                        catalog.append_move(move, intent.get("reason", ""), intent.get("flow_run"), tx)
                    for entry in catalog.tx_entries(move.kind, move.alias, tx):
                        catalog.write_head(entry)  # its mover may have died between the entry and its record
                _Transaction(store, tx).commit()
            if announce is not None:
                entries = [e for move in moves for e in catalog.tx_entries(move.kind, move.alias, tx)]
                _announce(entries, intent.get("payload") or {}, announce)
                _Transaction(store, tx).drain()


@contextmanager
def deleting(catalog: Any, announce: Announce | None = None) -> Iterator[None]:
    """Hold the store for a deleter (gc, rm): no alias moves meanwhile, and what dead movers left completed first."""
    with store_lock(catalog.store, exclusive=True):
        settle(catalog, announce)
        yield
