"""Local filesystem store: the embedded default backend.

Exclusive create is atomic: the bytes go to a temporary file in the same directory, which is
then hard-linked to the final name (``link`` fails if the name exists) — so a reader never
sees a half-written object and exactly one racing writer wins. Every write is durable when
it returns: the file is fsynced before its rename or link, the directory after it.
Compare-and-swap holds an exclusive ``flock`` on a sidecar lock file, which serialises
writers across processes.

A process stopped (SIGSTOP, a paused VM) inside a compare-and-swap keeps its lock, and no
lock can be taken from a live process safely. Writers of that one object therefore wait at
most ``lock_timeout_s`` and then get ``TransientStorageError`` (nothing written; retry), not
a hang; the lock is released when its holder resumes or dies.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from txntable.errors import (
    InvalidPathError,
    ObjectExistsError,
    ObjectNotFoundError,
    PreconditionFailedError,
    TransientStorageError,
)
from txntable.storage.base import Store, StoredObject, validate_key

_LOCK_SUFFIX = ".lock"
_TMP_PREFIX = ".tmp-"


def _etag(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: str) -> None:
    """Make the names created in ``directory`` durable (a rename is not, before this)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_directories(directory: str) -> None:
    """Create ``directory`` and its missing parents durably: a new directory's name is an
    entry of its parent, lost in a crash unless the parent is synced too."""
    if os.path.isdir(directory):
        return
    missing: list[str] = []
    path = directory
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):
        _fsync_directory(os.path.dirname(created))


class LocalStore(Store):
    """A store rooted at a local directory (created by the first write).

    Args:
        root: The directory of the warehouse.
        lock_timeout_s: How long ``put_if_match`` waits for the object's lock.

    Raises:
        InvalidPathError: If the root, or a directory above it, is a file.
    """

    def __init__(self, root: str, lock_timeout_s: float = 10.0) -> None:
        self.root = os.path.abspath(root)
        self.lock_timeout_s = lock_timeout_s
        self._resolved_root: str | None = None
        self.url = "file://" + self.root
        # The directory is created by the first write, never by opening: a read-only client
        # (or a typo) leaves no trace. A file where a directory belongs is refused now
        # rather than as a bare OSError at the first write.
        existing = self.root
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise InvalidPathError(
                f"local warehouse {self.root!r}: {existing!r} is a file, not a directory"
            )

    def _path(self, key: str) -> str:
        path = self._join(key)
        self._check_inside(key, path)
        return path

    def _join(self, key: str) -> str:
        validate_key(key)
        return os.path.join(self.root, *key.split("/"))

    def _check_inside(self, key: str, path: str) -> None:
        # validate_key already rejects "..", this guards against symlinked escapes too.
        if not os.path.realpath(path).startswith(self._real_root()):
            raise ObjectNotFoundError(key)

    def _real_root(self) -> str:
        """The root's resolved path and a separator; resolved once the root exists (every
        request checks against it: resolving is a system call per path component)."""
        real = self._resolved_root
        if real is None:
            real = os.path.realpath(self.root) + os.sep
            if os.path.isdir(self.root):
                self._resolved_root = real
        return real

    def _write_tmp(self, path: str, data: bytes) -> str:
        directory = os.path.dirname(path)
        _make_directories(directory)
        tmp = os.path.join(directory, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    @contextmanager
    def _locked(self, path: str) -> Iterator[None]:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path + _LOCK_SUFFIX, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            self._lock(fd, path)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _lock(self, fd: int, path: str) -> None:
        # Polled rather than blocking, so that a stopped holder costs a bounded wait; the
        # first attempt is the uncontended case's only one.
        deadline = time.monotonic() + self.lock_timeout_s
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TransientStorageError(
                        f"{os.path.relpath(path, self.root)}: its compare-and-swap lock was "
                        f"held for {self.lock_timeout_s:g} s by another process (stopped?); "
                        "nothing written"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.02)

    def get(self, key: str) -> StoredObject:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFoundError(key) from None
        return StoredObject(data, _etag(data))

    def exists(self, key: str) -> bool:
        # One stat, no read (and hash) of the bytes; the symlink check only for a hit
        # (the log probes for absent versions on every cold load).
        path = self._join(key)
        if not os.path.isfile(path):
            return False
        try:
            self._check_inside(key, path)
        except ObjectNotFoundError:  # a symlink leading out of the root
            return False
        return True

    def modified_ms(self, key: str) -> int | None:
        # The file system stamps files with this machine's clock, the one clock_ms reads.
        path = self._join(key)
        try:
            mtime_ns = os.stat(path).st_mtime_ns
            self._check_inside(key, path)
        except (FileNotFoundError, NotADirectoryError, ObjectNotFoundError):
            return None
        return mtime_ns // 1_000_000

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        os.replace(tmp, path)
        _fsync_directory(os.path.dirname(path))
        return _etag(data)

    def put_data_file(self, key: str, data: bytes) -> None:
        self.put_data_files([(key, data)])

    def put_data_files(self, items: Sequence[tuple[str, bytes]]) -> None:
        # Write every file, then fsync them one after the other, then rename each into place
        # and fsync each directory once: the disk flushes a round's files back to back, and
        # a directory holding several of them is synced once. No etag (nobody asks for one).
        written: list[tuple[int, str, str]] = []  # descriptor, temporary, final path
        written_ok = False
        try:
            for key, data in items:
                path = self._path(key)
                directory = os.path.dirname(path)
                _make_directories(directory)
                tmp = os.path.join(directory, f"{_TMP_PREFIX}{uuid.uuid4().hex}")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                written.append((fd, tmp, path))
                _write_all(fd, data)
            for fd, _, _ in written:
                os.fsync(fd)
            for _, tmp, path in written:
                os.replace(tmp, path)
            for directory in sorted({os.path.dirname(path) for _, _, path in written}):
                _fsync_directory(directory)
            written_ok = True
        finally:
            for fd, tmp, _ in written:
                os.close(fd)
                if not written_ok:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)

    def put_if_absent(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._write_tmp(path, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ObjectExistsError(key) from None
        finally:
            os.unlink(tmp)
        # Acknowledged means durable: the new name too, not only the bytes.
        _fsync_directory(os.path.dirname(path))
        return _etag(data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        path = self._path(key)
        with self._locked(path):
            current = self.get(key)
            if current.etag != etag:
                raise PreconditionFailedError(f"{key}: etag changed")
            tmp = self._write_tmp(path, data)
            os.replace(tmp, path)
            _fsync_directory(os.path.dirname(path))
        return _etag(data)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[str]:
        # A directory has no order, so this reads every entry under the prefix's directory
        # (os.scandir: names and types only, no stat): O(entries), which is why the log does
        # not list a healthy tail on local disk (``ordered_listing`` is False).
        directory, _, _ = prefix.rpartition("/")
        base = os.path.join(self.root, *directory.split("/")) if directory else self.root
        keys: list[str] = []
        self._scan(base, f"{directory}/" if directory else "", prefix, start_after, keys)
        keys.sort()
        return iter(keys)

    def _scan(
        self, path: str, rel: str, prefix: str, start_after: str | None, out: builtins.list[str]
    ) -> None:
        try:
            entries = os.scandir(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for entry in entries:
                name = entry.name
                if name.startswith(_TMP_PREFIX) or name.endswith(_LOCK_SUFFIX):
                    continue
                key = rel + name
                if entry.is_dir():
                    sub = key + "/"
                    # Symlinked directories are not followed (as os.walk's default).
                    if (sub.startswith(prefix) or prefix.startswith(sub)) and not (
                        entry.is_symlink()
                    ):
                        self._scan(entry.path, sub, prefix, start_after, out)
                elif key.startswith(prefix) and (start_after is None or key > start_after):
                    out.append(key)

    def list_children(self, prefix: str = "") -> Iterator[str]:
        base = os.path.join(self.root, *prefix.rstrip("/").split("/")) if prefix else self.root
        try:
            names = os.listdir(base)
        except (FileNotFoundError, NotADirectoryError):
            return iter(())
        hidden = (_TMP_PREFIX,)
        visible = (n for n in names if not n.startswith(hidden) and not n.endswith(_LOCK_SUFFIX))
        return iter(sorted(visible))

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def prune(self, prefix: str) -> None:
        top = os.path.join(self.root, *prefix.rstrip("/").split("/"))
        for path, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
            try:
                os.rmdir(path)  # only if empty: a file written meanwhile stays
            except OSError:
                pass
