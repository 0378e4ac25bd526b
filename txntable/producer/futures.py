"""What ``send`` and ``send_batch`` return: one outcome per batch, light handles per record.

As kafka-python's ``FutureProduceResult`` / ``FutureRecordMetadata``: the producer keeps one
:class:`ProduceResult` per accumulated batch (the rows' partitions and offsets as numpy
arrays, filled in when their segments are committed), and ``send`` returns a small
:class:`FutureRecordMetadata` that only holds the batch and its row number. Completing a
batch of a million records is a few vectorised assignments and one event, not a million
``Future`` objects.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from txntable.errors import KafkaTimeoutError
from txntable.structs import RecordMetadata

_log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class SegmentOffsets:
    """Rows of one ``send_batch`` call committed as one batch: a partition's offset range."""

    partition: int
    base_offset: int
    count: int


@dataclass(frozen=True)
class SendBatchResult:
    """Where the rows of a ``send_batch`` call landed.

    Attributes:
        topic: The table.
        segments: One entry per committed batch, in commit order (a partition's rows may
            span several batches when they exceed ``max_request_size``).
        partitions: The partition of every input row (numpy int32, input order).
        offsets: The offset of every input row (numpy int64, input order).
    """

    topic: str
    segments: tuple[SegmentOffsets, ...]
    partitions: np.ndarray
    offsets: np.ndarray

    @property
    def base_offsets(self) -> dict[int, int]:
        """The first offset written on each partition."""
        out: dict[int, int] = {}
        for s in self.segments:
            out[s.partition] = min(out.get(s.partition, s.base_offset), s.base_offset)
        return out

    @property
    def counts(self) -> dict[int, int]:
        """How many rows went to each partition."""
        out: dict[int, int] = {}
        for s in self.segments:
            out[s.partition] = out.get(s.partition, 0) + s.count
        return out


class ProduceResult:
    """The outcome of one batch of rows (kafka-python's ``FutureProduceResult``).

    Rows are numbered in the order they were given. ``start`` fixes the row count, their
    partitions and timestamps; ``resolve`` and ``fail`` settle rows segment by segment; the
    batch is done when every row is settled. A row whose offset is still -1 then failed with
    ``error``. Thread-safe.
    """

    __slots__ = (
        "topic",
        "partitions",
        "offsets",
        "timestamps",
        "error",
        "segments",
        "bases",
        "_pending",
        "_started",
        "_done",
        "_callbacks",
        "_lock",
    )

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.partitions = np.zeros(0, dtype=np.int32)
        self.offsets = np.zeros(0, dtype=np.int64)
        self.timestamps = np.zeros(0, dtype=np.int64)
        self.error: BaseException | None = None
        self.segments: list[SegmentOffsets] = []
        #: First row of each sending thread's slot (``send`` numbers rows per thread).
        self.bases: list[int] = [0]
        self._pending = 0
        self._started = False
        self._done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def start(self, rows: int, timestamps: np.ndarray) -> None:
        """Fix the number of rows and their timestamps (partitions follow with ``place``)."""
        with self._lock:
            self.partitions = np.full(rows, -1, dtype=np.int32)
            self.offsets = np.full(rows, -1, dtype=np.int64)
            self.timestamps = timestamps
            self._pending = rows
            self._started = True
        if rows == 0:
            self._finish()

    @property
    def started(self) -> bool:
        """Whether ``start`` was called (the rows were sealed into Arrow)."""
        return self._started

    def place(self, rows: np.ndarray, partitions: np.ndarray) -> None:
        """Record the partition chosen for ``rows``."""
        self.partitions[rows] = partitions

    def resolve(self, rows: np.ndarray, partition: int, base_offset: int) -> None:
        """``rows`` (in offset order) were committed from ``base_offset`` on ``partition``."""
        count = len(rows)
        with self._lock:
            self.offsets[rows] = np.arange(base_offset, base_offset + count, dtype=np.int64)
            self.segments.append(SegmentOffsets(partition, base_offset, count))
            self._pending -= count
            finished = self._pending == 0
        if finished:
            self._finish()

    def fail(self, rows: int, error: BaseException) -> None:
        """``rows`` rows will never be committed, because of ``error``."""
        with self._lock:
            if self.error is None:
                self.error = error
            self._pending -= rows
            finished = self._pending == 0
        if finished:
            self._finish()

    def _finish(self) -> None:
        self._done.set()
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _run_callback(fn)

    def done(self) -> bool:
        """Whether every row is settled."""
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        """Wait until done; ``False`` if ``timeout`` seconds passed first."""
        return self._done.wait(timeout)

    def add_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once done (at once, in this thread, if it already is)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        _run_callback(fn)

    def record(self, index: int) -> RecordMetadata:
        """The metadata of row ``index`` (``slot << 32 | row of the slot``), or raise the
        error that lost it."""
        if index >> 32:
            index = self.bases[index >> 32] + (index & 0xFFFFFFFF)
        offset = int(self.offsets[index])
        if offset < 0:
            assert self.error is not None
            raise self.error
        return RecordMetadata(
            self.topic, int(self.partitions[index]), offset, int(self.timestamps[index])
        )

    def batch(self) -> SendBatchResult:
        """Everything as a :class:`SendBatchResult`, or raise the error of a lost row."""
        if self.error is not None:
            raise self.error
        return SendBatchResult(self.topic, tuple(self.segments), self.partitions, self.offsets)


def _run_callback(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - as concurrent.futures: a callback never breaks the sender
        _log.exception("exception calling a producer callback")


class _Handle(Generic[T]):
    """The future-like interface shared by record and batch handles.

    ``result``/``exception``/``done``/``add_done_callback`` as ``concurrent.futures.Future``;
    ``get``/``add_callback``/``add_errback``/``succeeded``/``failed`` as kafka-python's.
    """

    __slots__ = ("_batch",)
    _batch: ProduceResult

    def _value(self) -> T:
        raise NotImplementedError

    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._batch.done()

    def running(self) -> bool:
        """Whether the outcome is still pending."""
        return not self._batch.done()

    def cancel(self) -> bool:
        """Sends cannot be cancelled: always ``False``."""
        return False

    def cancelled(self) -> bool:
        """Always ``False``."""
        return False

    def result(self, timeout: float | None = None) -> T:
        """The outcome, waiting up to ``timeout`` seconds.

        Raises:
            TimeoutError: Not done within ``timeout``.
            TxnTableError: The error that lost the record(s).
        """
        if not self._batch.wait(timeout):
            raise TimeoutError(f"not done after {timeout} s")
        return self._value()

    def get(self, timeout: float | None = None) -> T:
        """kafka-python's ``get``: as ``result`` but raising ``KafkaTimeoutError``."""
        if not self._batch.wait(timeout):
            raise KafkaTimeoutError(f"not done after {timeout} s")
        return self._value()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error, ``None`` on success, waiting up to ``timeout`` seconds."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except BaseException as e:  # noqa: BLE001 - handing the error back is the point
            return e
        return None

    def succeeded(self) -> bool:
        """Done and successful."""
        return self.done() and self.exception(0) is None

    def failed(self) -> bool:
        """Done and failed."""
        return self.done() and self.exception(0) is not None

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(self)`` once done (at once if it already is)."""

        def call() -> None:
            fn(self)

        self._batch.add_callback(call)

    def add_callback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> _Handle[T]:
        """On success call ``fn(*args, value, **kwargs)`` (kafka-python's ``add_callback``)."""

        def call() -> None:
            try:
                value = self._value()
            except BaseException:  # noqa: BLE001 - the errback's business
                return
            fn(*args, value, **kwargs)

        self._batch.add_callback(call)
        return self

    def add_errback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> _Handle[T]:
        """On failure call ``fn(*args, error, **kwargs)`` (kafka-python's ``add_errback``)."""

        def call() -> None:
            try:
                self._value()
            except BaseException as e:  # noqa: BLE001 - handing the error on is the point
                fn(*args, e, **kwargs)

        self._batch.add_callback(call)
        return self


class FutureRecordMetadata(_Handle[RecordMetadata]):
    """What ``send`` returns: a record's row in its batch's :class:`ProduceResult`."""

    __slots__ = ("_index",)

    def __init__(self, batch: ProduceResult, index: int) -> None:
        self._batch = batch
        self._index = index

    def _value(self) -> RecordMetadata:
        return self._batch.record(self._index)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"FutureRecordMetadata({self._batch.topic!r}, row {self._index}, {state})"


class FutureSendBatch(_Handle[SendBatchResult]):
    """What ``send_batch`` returns; its result is a :class:`SendBatchResult`."""

    __slots__ = ()

    def __init__(self, batch: ProduceResult) -> None:
        self._batch = batch

    def _value(self) -> SendBatchResult:
        return self._batch.batch()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"FutureSendBatch({self._batch.topic!r}, {state})"
