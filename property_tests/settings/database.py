"""The suite's hypothesis example database: where it lives, how runners share it, how it travels.

A database is named by one string: ``--db`` of ``mla-fuse fuzz`` and ``mla-fuse db``, and
``$MLA_FUSE_HYPOTHESIS_DB`` for every pytest run of the suite (the profiles open it).

``redis://[:password@]host:port/db``  a Redis server every runner reaches
                                      (``hypothesis.extra.redis.RedisExampleDatabase``,
                                      keys prefixed ``mla-fuse-example:``); also
                                      ``rediss://`` and ``unix://``
a directory                           ``DirectoryBasedExampleDatabase``
nothing                               the directory ``.hypothesis/mla_fuse`` under the current one

Read-only (``--read-only``, ``$MLA_FUSE_HYPOTHESIS_DB_READ_ONLY=1``): hypothesis' recipe,
``MultiplexedDatabase(local directory, ReadOnlyDatabase(shared))``: every stored failure of the
shared database is read and replayed, and what the run writes (its own failures, HypoFuzz's
corpus and reports) lands in the local directory only.

Keys. Hypothesis keys a test by a digest of its source; every ``@prop`` property is the same
wrapper function, so before this module all of them shared one key, and HypoFuzz adds the
pytest node id to the digest of every test. ``key_by_suite_node_id`` (called by the suite's
pytest plugin before each property runs) adds the same node id, spelled from the suite's own
directory (``test_mla.py::test_fused_mla_matches_reference``, whatever directory pytest was
started from), which is what ``mla-fuse fuzz`` makes HypoFuzz see (``--rootdir`` = the suite's
directory). So a failure HypoFuzz stores is replayed by a plain pytest run, and each property
(each bad-input corruption) has a key of its own.

Export (``mla-fuse db export FILE``): one zip file holding a ``DirectoryBasedExampleDatabase``
(hypothesis' own layout, with its ``.hypothesis-keys`` index of the raw keys) and a manifest;
unzipped into ``.hypothesis/mla_fuse`` it is a working database, and ``mla-fuse db import FILE``
adds every entry to any database (directory or Redis).

Versions. hypothesis is a range (``hypothesis>=6.139,<7`` in pyproject.toml), so runners sharing a
database, or a laptop replaying a runner's, may run different versions. An entry is hypothesis'
choice sequence, which another version may read as another case or not at all. Each key is stamped
with the version that saved it (``VersionStampedDatabase``): a run under another version still
replays the entries that parse (they may no longer rebuild the case that failed), skips those that
do not, and warns once per key with a ``StaleExamplesWarning`` naming both versions and the counts;
import warns when the export's version is not this one. Failure files replay under any version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shlex
import sys
import tempfile
import warnings
import zipfile
from urllib.parse import urlsplit

import hypothesis
from hypothesis import settings
from hypothesis.database import (DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase,
                                 ReadOnlyDatabase, choices_from_bytes)
from hypothesis.internal.reflection import function_digest

from mla_fuse_conformance.settings.legacy_keys import legacy_key

DATABASE_ENV_VAR = "MLA_FUSE_HYPOTHESIS_DB"
READ_ONLY_ENV_VAR = "MLA_FUSE_HYPOTHESIS_DB_READ_ONLY"
DEFAULT_DIRECTORY = pathlib.Path(".hypothesis") / "mla_fuse"
REDIS_SCHEMES = ("redis", "rediss", "unix")
REDIS_KEY_PREFIX = b"mla-fuse-example:"
MANIFEST = "mla_fuse_database.json"
EXPORT_FORMAT = "mla_fuse example database export, version 1"


def default_directory() -> pathlib.Path:
    return DEFAULT_DIRECTORY.absolute()


def is_redis_url(url: str | None) -> bool:
    return bool(url) and urlsplit(url).scheme in REDIS_SCHEMES


def shown(url: str | None) -> str:
    """``url`` for printing: a Redis password replaced by ``***``; the default directory by its path."""
    if not url:
        return str(default_directory())
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username or ''}:***@{parts.hostname}"
                                 + (f":{parts.port}" if parts.port else "")).geturl()


def open_shared(url: str | None, source: str = f"${DATABASE_ENV_VAR}") -> ExampleDatabase:
    """The database ``url`` names (see the module docstring); ``source`` names where it came from in errors."""
    if not url:
        return DirectoryBasedExampleDatabase(default_directory())
    if is_redis_url(url):
        return _open_redis(url, source)
    if "://" in url:
        raise ValueError(f"{source}: {url!r} is neither a directory nor a redis://host:port/db URL")
    return DirectoryBasedExampleDatabase(pathlib.Path(url).absolute())


def _open_redis(url: str, source: str) -> ExampleDatabase:
    try:  # deferred: an optional dependency (the fuzz extra)
        from redis import Redis

        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as missing:  # not an ImportError: the plugin reads that as "hypothesis is missing"
        raise RuntimeError(f"{source}: {shown(url)} is a Redis server, but the redis client is not installed "
                           f"(pip install 'mla_fuse[fuzz]')") from missing
    try:
        client = Redis.from_url(url)
    except ValueError as error:
        raise ValueError(f"{source}: {shown(url)} is not a valid Redis URL: {error}") from None
    return RedisExampleDatabase(client, key_prefix=REDIS_KEY_PREFIX)


def open_database(url: str | None, read_only: bool = False,
                  source: str = f"${DATABASE_ENV_VAR}") -> ExampleDatabase:
    """The database for a run: ``url``'s, or with ``read_only`` the local directory in front of it;
    entries written by another hypothesis version are reported (``VersionStampedDatabase``)."""
    shared = open_shared(url, source)
    if not read_only:
        return VersionStampedDatabase(shared)
    local = DirectoryBasedExampleDatabase(default_directory())
    if shared == local:
        return VersionStampedDatabase(ReadOnlyDatabase(shared))
    return VersionStampedDatabase(MultiplexedDatabase(local, ReadOnlyDatabase(shared)))


# ---------------------------------------------------------------- entries of another hypothesis version

VERSION_SUFFIX = b".mla-fuse-hypothesis-version"


class StaleExamplesWarning(UserWarning):
    """Saved examples were written by another hypothesis version (see ``VersionStampedDatabase``)."""


def _identity(database: ExampleDatabase):
    """What makes two databases the same store: for Redis the server, db number and key prefix (two
    clients of one URL compare unequal in hypothesis, and HypoFuzz refuses a test whose database
    differs from the default one), else the database itself."""
    pool = getattr(getattr(database, "redis", None), "connection_pool", None)
    if pool is None:
        return database
    kwargs = pool.connection_kwargs
    return ("redis", kwargs.get("host"), kwargs.get("port"), kwargs.get("db"), kwargs.get("path"),
            getattr(database, "_prefix", None))


class VersionStampedDatabase(ExampleDatabase):
    """``wrapped``, with the hypothesis version that saved under each key stored beside it.

    Hypothesis stores an example as its choice sequence; a newer hypothesis may read an older
    sequence differently (another case) or not at all, and it drops what it cannot read without a
    word. Here a fetch from a key that another version wrote warns once per key and process
    (``StaleExamplesWarning``, shown in pytest's warnings summary): how many entries still parse
    (they are replayed, but may no longer rebuild the case that failed) and how many do not (not
    replayed). Failure files do not depend on the version: ``mla-fuse repro FILE`` rebuilds the
    case from the file.

    ``aliases`` maps a key to an older key of the same test (``legacy_keys``): its entries are
    fetched too, so examples saved before a property's key changed still replay.
    """

    def __init__(self, wrapped: ExampleDatabase) -> None:
        super().__init__()
        self.wrapped = wrapped
        self.version = hypothesis.__version__.encode()
        self.warned: set[bytes] = set()
        self.aliases: dict[bytes, bytes] = {}

    def __repr__(self) -> str:
        return f"VersionStampedDatabase({self.wrapped!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VersionStampedDatabase) and _identity(self.wrapped) == _identity(other.wrapped)

    def __hash__(self) -> int:
        return hash(repr(_identity(self.wrapped)))

    def fetch(self, key: bytes):
        for stored in (key, self.aliases.get(key)):
            if stored is None:
                continue
            values = list(self.wrapped.fetch(stored))
            if values and not stored.endswith(VERSION_SUFFIX) and stored not in self.warned:
                writers = set(self.wrapped.fetch(stored + VERSION_SUFFIX))
                if writers and self.version not in writers:
                    self.warned.add(stored)
                    warnings.warn(stale_message(stored, values, writers, self.version), StaleExamplesWarning,
                                  stacklevel=2)
            yield from values

    def save(self, key: bytes, value: bytes) -> None:
        self.wrapped.save(key, value)
        if not key.endswith(VERSION_SUFFIX):
            for other in set(self.wrapped.fetch(key + VERSION_SUFFIX)) - {self.version}:
                self.wrapped.delete(key + VERSION_SUFFIX, other)
            self.wrapped.save(key + VERSION_SUFFIX, self.version)

    def delete(self, key: bytes, value: bytes) -> None:
        self.wrapped.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.wrapped.move(src, dest, value)

    # Listening: HypoFuzz's workers learn of each other's corpus and failures through the database's
    # change events (hypothesis' ``add_listener``); the wrapped database has them (a directory through
    # watchdog, Redis through pub/sub), so they are passed on, less the version stamps.
    def _start_listening(self) -> None:
        self.wrapped.add_listener(self._pass_on)

    def _stop_listening(self) -> None:
        self.wrapped.remove_listener(self._pass_on)

    def _pass_on(self, event) -> None:
        key = event[1][0]
        if key is None or not key.endswith(VERSION_SUFFIX):
            self._broadcast_change(event)


def stale_message(key: bytes, values: list[bytes], writers: set[bytes], version: bytes) -> str:
    unreadable = sum(choices_from_bytes(value) is None for value in values)
    written = ", ".join(sorted(writer.decode(errors="replace") for writer in writers))
    return (f"{len(values)} saved example(s) under database key {key[:24].hex()}... were written by hypothesis "
            f"{written}; this is hypothesis {version.decode()}: {len(values) - unreadable} are replayed but may no "
            f"longer rebuild the case that failed, {unreadable} cannot be read and are not replayed. A failure "
            f"file replays under any version: {shlex.quote(sys.executable)} -m mla_fuse_conformance repro FILE")


def read_only_from_environment() -> bool:
    return os.environ.get(READ_ONLY_ENV_VAR, "").lower() in ("1", "true", "yes")


def from_environment() -> ExampleDatabase:
    """What the profiles use: ``$MLA_FUSE_HYPOTHESIS_DB``, read-only with ``$MLA_FUSE_HYPOTHESIS_DB_READ_ONLY``."""
    return open_database(os.environ.get(DATABASE_ENV_VAR), read_only_from_environment())


def check_reachable(url: str | None, source: str) -> None:
    """Raise a RuntimeError naming ``source`` when ``url`` is a Redis server that does not answer."""
    database = open_shared(url, source)
    if not is_redis_url(url):
        return
    from redis.exceptions import RedisError  # deferred: an optional dependency (the fuzz extra)

    try:
        database.redis.ping()
    except RedisError as error:
        raise RuntimeError(f"{source}: cannot reach the Redis server {shown(url)}: {error}") from None


# ---------------------------------------------------------------- one key per property, shared with HypoFuzz


def suite_node_id(item) -> str:
    """The pytest node id of a suite item as HypoFuzz sees it from the suite's directory:
    ``test_flash.py::test_flash_cache_write_rejects_bad_input[cache_rank_3]``."""
    return f"{item.path.name}::{item.nodeid.split('::', 1)[1]}"


def key_by_suite_node_id(item, bad_input: bool | None = None, databases=None) -> None:
    """Key a hypothesis test's database entries by its suite node id (see the module docstring).
    For a kernel property (``bad_input`` not None) the key it had in the wrapper layout (``settings.legacy_keys``) is read too, from
    ``databases`` (default: those of the loaded profile and of the test's own settings)."""
    test = getattr(getattr(item, "obj", None), "hypothesis", None)
    if test is None:
        return
    node = suite_node_id(item)
    test.inner_test._hypothesis_internal_add_digest = node.encode()
    if bad_input is None:
        return
    if databases is None:
        chosen = (settings.default, getattr(item.obj, "_hypothesis_internal_use_settings", None))
        databases = [each.database for each in chosen if each is not None]
    for each in databases:
        if isinstance(each, VersionStampedDatabase):
            each.aliases[function_digest(test.inner_test)] = legacy_key(node, bad_input)


# ---------------------------------------------------------------- export and import


@dataclasses.dataclass(frozen=True)
class Copied:
    keys: int
    values: int


def stored_keys(database: ExampleDatabase) -> list[bytes]:
    """Every key that holds values: a directory's ``.hypothesis-keys`` index, or a Redis SCAN."""
    if isinstance(database, DirectoryBasedExampleDatabase):
        return sorted(database.fetch(DirectoryBasedExampleDatabase._metakeys_name))
    redis = getattr(database, "redis", None)
    if redis is not None:
        return sorted(key[len(REDIS_KEY_PREFIX):] for key in redis.scan_iter(match=REDIS_KEY_PREFIX + b"*"))
    raise TypeError(f"cannot list the keys of {database!r}: expected a directory or a Redis database")


def copy_entries(source: ExampleDatabase, target: ExampleDatabase) -> Copied:
    keys = values = 0
    for key in stored_keys(source):
        entries = list(source.fetch(key))
        for value in entries:
            target.save(key, value)
        keys += bool(entries)
        values += len(entries)
    return Copied(keys, values)


def export_database(source: ExampleDatabase, path: pathlib.Path) -> Copied:
    """Write every entry of ``source`` to the zip file ``path`` (replaced whole, or not at all)."""
    with tempfile.TemporaryDirectory() as staging:
        copied = copy_entries(source, DirectoryBasedExampleDatabase(staging))
        manifest = {"format": EXPORT_FORMAT, "hypothesis": hypothesis.__version__, "keys": copied.keys,
                    "values": copied.values}
        partial = path.with_name(path.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(MANIFEST, json.dumps(manifest, indent=1) + "\n")
            for file in sorted(pathlib.Path(staging).rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(staging).as_posix())
        partial.replace(path)
    return copied


def read_manifest(path: pathlib.Path) -> dict:
    """The manifest of an export; ValueError naming ``path`` if it is not one."""
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MANIFEST))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"{path}: not an mla-fuse database export ({error})") from None
    if manifest.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: unknown export format {manifest.get('format')!r}, expected {EXPORT_FORMAT!r}")
    return manifest


def import_database(path: pathlib.Path, target: ExampleDatabase) -> Copied:
    """Add every entry of the export ``path`` to ``target`` (entries already there stay)."""
    read_manifest(path)
    with tempfile.TemporaryDirectory() as staging, zipfile.ZipFile(path) as archive:
        archive.extractall(staging)
        return copy_entries(DirectoryBasedExampleDatabase(staging), target)


# ---------------------------------------------------------------- mla-fuse db export|import


def add_db(commands) -> None:
    db = commands.add_parser("db", help="export the example database to one file, or import such a file")
    actions = db.add_subparsers(dest="action", required=True)
    for action, text in (("export", "write every entry of the database to FILE (a zip)"),
                         ("import", "add every entry of FILE (made by `db export`) to the database")):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("file", type=pathlib.Path, metavar="FILE")
        parser.add_argument("--db", default=os.environ.get(DATABASE_ENV_VAR),
                            help=f"redis://host:port/db or a directory (default: ${DATABASE_ENV_VAR}, "
                                 f"else {DEFAULT_DIRECTORY})")
    db.set_defaults(run=run_db)


def run_db(args) -> int:
    try:
        if args.action == "export":
            check_reachable(args.db, "--db")
            copied = export_database(open_shared(args.db, "--db"), args.file)
            print(f"exported {copied.values} entries under {copied.keys} keys from {shown(args.db)} to {args.file}")
            return 0
        manifest = read_manifest(args.file)
        check_reachable(args.db, "--db")
        if manifest["hypothesis"] != hypothesis.__version__:
            print(f"warning: {args.file} was written by hypothesis {manifest['hypothesis']}, this is "
                  f"{hypothesis.__version__}: entries that still parse are replayed but may not rebuild the case that "
                  f"failed (a run that fetches them warns: StaleExamplesWarning)")
        copied = import_database(args.file, open_shared(args.db, "--db"))
        print(f"imported {copied.values} entries under {copied.keys} keys from {args.file} into {shown(args.db)}")
        return 0
    except (ValueError, RuntimeError, OSError) as error:
        print(f"mla-fuse db {args.action}: {error}")
        return 2
