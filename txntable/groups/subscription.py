"""A subscribed consumer's side of group membership (``Consumer.subscribe``).

Kafka's ``ConsumerCoordinator``: join at the first poll, heartbeat from a background
thread, leave when ``poll`` is not called for ``max_poll_interval_ms``, and at each poll
apply a new generation — revoke (listener, auto-commit), acknowledge, fence, assign. The
group object and its transitions are :mod:`txntable.groups.member` and
:mod:`txntable.groups.state`; the procedure is ``spec/PROTOCOL.md#member-procedure``.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, NoReturn, Protocol

from txntable.errors import (
    CommitFailedError,
    FencedInstanceIdError,
    TableNotFoundError,
    TxnTableError,
    UnknownMemberIdError,
)
from txntable.groups import state as membership
from txntable.groups.member import update_group, write_fence
from txntable.groups.state import GroupState
from txntable.structs import TopicPartition
from txntable.util import now_ms

if TYPE_CHECKING:
    from txntable.structs import OffsetAndMetadata
    from txntable.warehouse import Warehouse


class GroupClient(Protocol):
    """What a subscription needs of the consumer it runs for (:class:`txntable.Consumer`
    implements it): the group settings, the warehouse, and four calls into its state."""

    @property
    def warehouse(self) -> Warehouse: ...
    @property
    def group_id(self) -> str | None: ...
    @property
    def group_instance_id(self) -> str | None: ...
    @property
    def client_id(self) -> str: ...
    @property
    def session_timeout_ms(self) -> int: ...
    @property
    def heartbeat_interval_ms(self) -> int: ...
    @property
    def max_poll_interval_ms(self) -> int: ...
    @property
    def metadata_max_age_ms(self) -> int: ...
    @property
    def enable_auto_commit(self) -> bool: ...
    @property
    def partition_assignment_strategy(self) -> tuple[str, ...]: ...

    def partition_count(self, table: str) -> int:
        """Partitions of ``table`` now."""
        ...

    def assign_from_group(
        self, partitions: set[TopicPartition], gained: set[TopicPartition]
    ) -> None:
        """Install the group's assignment; ``gained`` start again from the committed offset."""
        ...

    def positions_as_offsets(
        self, tps: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The current positions of ``tps`` (those that have one), as offsets to commit."""
        ...

    def commit_for_generation(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], generation: int
    ) -> None:
        """Commit ``offsets`` as a member of ``generation``."""
        ...


def _leave(state: GroupState, member_id: str) -> GroupState:
    return membership.leave(state, member_id, now_ms())


def _heartbeat(state: GroupState, member_id: str, instance_id: str | None) -> GroupState:
    return membership.heartbeat(state, member_id, now_ms(), instance_id)


class ConsumerRebalanceListener:
    """Callbacks around rebalances (Kafka's ``ConsumerRebalanceListener``).

    They run in the thread that calls ``poll`` (or ``close`` / ``unsubscribe``), never in
    the heartbeat thread, so they may use the consumer (commit, seek, position).
    """

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Partitions this consumer gives up; commit their offsets here if needed."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Partitions newly given to this consumer (cooperative: only the added ones)."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """Partitions taken away without a revocation (session expired, fenced); they may
        already belong to another member, so their offsets can no longer be committed.
        Kafka's default calls :meth:`on_partitions_revoked`."""
        self.on_partitions_revoked(lost)


class Subscription:
    """Membership state of one subscribed consumer."""

    def __init__(
        self,
        consumer: GroupClient,
        topics: frozenset[str] | None,
        pattern: re.Pattern[str] | None,
        listener: ConsumerRebalanceListener,
    ) -> None:
        self.consumer = consumer
        self.topics = topics
        self.pattern = pattern
        self.listener = listener
        self.member_id: str | None = None
        #: Generation whose assignment this member applied (acknowledged); −1 before.
        self.generation = -1
        self.owned: set[TopicPartition] = set()
        self.cooperative = False
        self.subscribed: frozenset[str] = frozenset()
        self._latest: GroupState | None = None
        self._lost: Exception | None = None
        #: Set when another process joined with this member's ``group_instance_id``: fatal,
        #: as in Kafka (re-joining would fence that process in turn, forever).
        self.fenced: FencedInstanceIdError | None = None
        self._left_by_poll_timeout = False
        self._last_poll = time.monotonic()
        self._next_match = time.monotonic()
        self._last_heartbeat = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def group_id(self) -> str:
        assert self.consumer.group_id is not None
        return self.consumer.group_id

    def _store(self):  # type: ignore[no-untyped-def]
        return self.consumer.warehouse.store

    # --- heartbeat thread ----------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name="txntable-heartbeat", daemon=True
        )
        self._thread.start()

    def _heartbeat_loop(self) -> None:
        c = self.consumer
        interval = c.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            member_id = self.member_id
            if member_id is None:
                return
            if time.monotonic() - self._last_poll > c.max_poll_interval_ms / 1000:
                # Kafka's poll timeout: the application is stuck, so give the partitions
                # to someone who polls. The next poll joins again.
                try:
                    update_group(
                        self._store(),
                        self.group_id,
                        partial(_leave, member_id=member_id),
                    )
                except TxnTableError:
                    pass  # the session timeout removes it anyway
                with self._lock:
                    self._left_by_poll_timeout = True
                return
            try:
                state = update_group(
                    self._store(),
                    self.group_id,
                    partial(_heartbeat, member_id=member_id, instance_id=c.group_instance_id),
                )
            except (UnknownMemberIdError, FencedInstanceIdError) as e:
                with self._lock:
                    self._lost = e
                return
            except (TxnTableError, OSError):
                continue  # storage trouble: try again at the next interval
            with self._lock:
                self._remember(state)
                self._last_heartbeat = time.monotonic()

    def _remember(self, state: GroupState) -> None:
        # The poll thread may already hold a newer state than a heartbeat that raced it:
        # never go back to an older generation. Called with the lock held.
        if self._latest is None or state.generation >= self._latest.generation:
            self._latest = state

    def _heartbeat_now(self) -> GroupState:
        member_id = self.member_id
        assert member_id is not None
        state = update_group(
            self._store(),
            self.group_id,
            partial(_heartbeat, member_id=member_id, instance_id=self.consumer.group_instance_id),
        )
        with self._lock:
            self._latest = state
            self._last_heartbeat = time.monotonic()
        return state

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat thread (and wait for it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        self._thread = None

    # --- membership at poll --------------------------------------------------------------

    def _match(self) -> frozenset[str]:
        if self.topics is not None:
            return self.topics
        assert self.pattern is not None
        return frozenset(
            t for t in self.consumer.warehouse.list_tables() if self.pattern.fullmatch(t)
        )

    def _partition_counts(self, tables: frozenset[str]) -> dict[str, int]:
        counts = {}
        for t in sorted(tables):
            try:
                counts[t] = self.consumer.partition_count(t)
            except TableNotFoundError:
                continue  # Kafka assigns nothing of a topic that does not exist
        return counts

    def _join_as(self, member_id: str) -> GroupState:
        """Join (or re-join) the group as ``member_id`` with the current subscription."""
        c = self.consumer
        counts = self._partition_counts(self.subscribed)
        self._schedule_refresh(counts)
        return update_group(
            self._store(),
            self.group_id,
            lambda s: membership.join(
                s,
                member_id,
                self.subscribed,
                c.partition_assignment_strategy,
                counts,
                now_ms(),
                c.session_timeout_ms,
                c.max_poll_interval_ms,
                c.group_instance_id,
            ),
        )

    def join(self) -> GroupState:
        """Join the group (a new member id) and start heartbeating."""
        self.member_id = member_id = f"{self.consumer.client_id}-{uuid.uuid4().hex}"
        self.subscribed = self._match()
        state = self._join_as(member_id)
        with self._lock:
            self._latest = state
            self._lost = None
            self._left_by_poll_timeout = False
            self._last_heartbeat = time.monotonic()
        self._start_heartbeat()
        return state

    def poll(self) -> None:
        """Called at the start of every ``poll``: join, notice loss, apply a new generation.

        Raises:
            FencedInstanceIdError: Another process joined with this consumer's
                ``group_instance_id`` (now or before): it never joins again.
        """
        self.check_fenced()
        self._last_poll = time.monotonic()
        with self._lock:
            lost, left, state = self._lost, self._left_by_poll_timeout, self._latest
        if lost is None and not left and self.member_id is not None:
            # The heartbeat thread is late (the process was stopped, or storage was slow):
            # make sure this member is still in the group before using its partitions.
            since = time.monotonic() - self._last_heartbeat
            if since > self.consumer.session_timeout_ms / 2000:
                try:
                    state = self._heartbeat_now()
                except (UnknownMemberIdError, FencedInstanceIdError) as e:
                    lost = e
        if isinstance(lost, FencedInstanceIdError):
            self._fence(lost)
        if lost is not None or left:
            self.lose()
            state = None
        if self.member_id is None:
            state = self.join()
        elif time.monotonic() >= self._next_match:
            assert state is not None
            if self._metadata_changed(state):
                state = self.join_again()
        assert state is not None
        while state is not None and state.generation > self.generation:
            state = self._apply(state)

    def _metadata_changed(self, state: GroupState) -> bool:
        """Kafka's metadata refresh: whether the subscription now resolves to other tables
        (a pattern) or other partition counts (a table created or grown since the group
        last counted it) than ``state`` holds. Looked up every ``metadata_max_age_ms``, and
        every heartbeat interval while a subscribed table does not exist."""
        if self._match() != self.subscribed:
            return True
        counts = self._partition_counts(self.subscribed)
        self._schedule_refresh(counts)
        return any(state.partitions.get(t) != n for t, n in counts.items())

    def _schedule_refresh(self, counts: dict[str, int]) -> None:
        c = self.consumer
        wait = c.metadata_max_age_ms
        if len(counts) < len(self.subscribed):  # a table not created yet: look again soon
            wait = min(wait, c.heartbeat_interval_ms)
        self._next_match = time.monotonic() + wait / 1000

    def join_again(self) -> GroupState:
        """Re-join with a new subscription (a pattern matched a new table)."""
        member_id = self.member_id
        assert member_id is not None
        self.subscribed = self._match()
        state = self._join_as(member_id)
        with self._lock:
            self._latest = state
        return state

    def _apply(self, state: GroupState) -> GroupState | None:
        """Apply ``state``'s generation; the newer state if acknowledging produced one."""
        c = self.consumer
        member_id = self.member_id
        assert member_id is not None
        me = state.members.get(member_id)
        if me is None:
            instance = c.group_instance_id
            if instance is not None and any(
                m.group_instance_id == instance for m in state.members.values()
            ):
                self._fence(
                    FencedInstanceIdError(
                        f"group {self.group_id}: another process joined as group_instance_id "
                        f"{instance!r}; member {member_id} is fenced"
                    )
                )
            self.lose()
            return None
        new = {TopicPartition(t, p) for t, p in me.assignment}
        old = set(self.owned)
        self.cooperative = state.cooperative
        revoked = old - new if self.cooperative else old
        if revoked or not self.cooperative:
            self._revoke(revoked, state.generation)
        try:
            after = update_group(
                self._store(),
                self.group_id,
                lambda s: membership.ack(
                    s, member_id, state.generation, now_ms(), c.group_instance_id
                ),
            )
        except FencedInstanceIdError as e:
            self._fence(e)
        except UnknownMemberIdError:
            self.lose()
            return None
        if after.generation != state.generation and after.members.get(member_id) is not None:
            acked = after.members[member_id].acked_generation == state.generation
            if not acked:
                # A newer generation came first: apply that one instead.
                with self._lock:
                    self._latest = after
                return after
        self.generation = state.generation
        self.owned = new
        gained = new - (old - revoked)
        if gained:
            write_fence(self._store(), self.group_id, state.generation, member_id)
        c.assign_from_group(new, gained)
        added = new - old if self.cooperative else new
        self.listener.on_partitions_assigned(added)
        with self._lock:
            self._latest = after
        return after

    def _revoke(self, revoked: set[TopicPartition], generation: int) -> None:
        c = self.consumer
        self.listener.on_partitions_revoked(set(revoked))
        if c.enable_auto_commit and revoked:
            offsets = c.positions_as_offsets(revoked)
            if offsets:
                # The member is in ``generation`` (it has not acknowledged yet, so nobody
                # else was given these partitions): commit under it, past any fence.
                try:
                    c.commit_for_generation(offsets, generation)
                except CommitFailedError:
                    pass  # fenced meanwhile: the new owner reads what was committed before
        c.assign_from_group(set(self.owned) - revoked, set())
        self.owned -= revoked

    def _fence(self, error: FencedInstanceIdError) -> NoReturn:
        """Another process has this member's ``group_instance_id``: lose the partitions and
        raise, now and at every later poll (Kafka's fatal FencedInstanceIdException)."""
        self.fenced = error
        self.lose()
        raise FencedInstanceIdError(str(error))

    def check_fenced(self) -> None:
        """Raise the fencing error again if this member was fenced.

        Raises:
            FencedInstanceIdError: It was.
        """
        if self.fenced is not None:
            raise FencedInstanceIdError(
                f"{self.fenced} (the consumer stays fenced: close it; two consumers must not "
                "share a group_instance_id)"
            )

    def lose(self) -> None:
        """The member is out of the group: its partitions are lost (no commit)."""
        self.stop_heartbeat()
        lost = set(self.owned)
        self.member_id = None
        # The generation is kept: a commit or group_metadata() of this consumer still
        # carries it, so the fence of the newer generation refuses it.
        self.owned = set()
        with self._lock:
            self._latest = None
            self._lost = None
            self._left_by_poll_timeout = False
        self.consumer.assign_from_group(set(), set())
        if lost:
            self.listener.on_partitions_lost(lost)

    def leave(self, commit: Callable[[], None] | None) -> None:
        """Revoke everything (committing first), then leave unless static (KIP-345)."""
        member_id = self.member_id
        if member_id is None:
            return
        if self.owned:
            if commit is not None:
                try:
                    commit()
                except CommitFailedError:
                    pass  # no longer the owner: nothing of ours may be committed
            self.listener.on_partitions_revoked(set(self.owned))
        self.stop_heartbeat()
        if self.consumer.group_instance_id is None:
            update_group(
                self._store(),
                self.group_id,
                partial(_leave, member_id=member_id),
            )
        self.member_id = None
        self.generation = -1
        self.owned = set()
        self.consumer.assign_from_group(set(), set())

    def commit_generation(self) -> int:
        """Generation to commit under; −1 before the first generation was applied."""
        return self.generation

    def newer_generation_owning(self, tps: set[TopicPartition]) -> int | None:
        """A newer generation in which this member still owns every one of ``tps`` (read
        from the group object; the next ``poll`` applies that generation)."""
        member_id = self.member_id
        if member_id is None:
            return None
        from txntable.groups.member import load_group

        state, _ = load_group(self._store(), self.group_id)
        with self._lock:
            self._remember(state)
        me = state.members.get(member_id)
        if me is None or state.generation <= self.generation:
            return None
        mine = {TopicPartition(t, p) for t, p in me.assignment}
        if tps <= mine and tps <= self.owned:
            return state.generation
        return None
