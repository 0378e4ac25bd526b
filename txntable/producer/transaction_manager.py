"""Client-side transaction state (Kafka's ``TransactionManager.State``) and its legal moves."""

from __future__ import annotations

import enum
import threading

from txntable.errors import InvalidTxnStateError, TxnTableError


class ClientTxnState(enum.Enum):
    """Where a transactional producer is in its life cycle."""

    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


C = ClientTxnState
#: Legal previous states of each state (Kafka's ``State.isTransitionValid``).
LEGAL_TRANSITIONS: dict[ClientTxnState, frozenset[ClientTxnState]] = {
    C.UNINITIALIZED: frozenset(),
    C.INITIALIZING: frozenset({C.UNINITIALIZED, C.ABORTING_TRANSACTION}),
    C.READY: frozenset({C.INITIALIZING, C.COMMITTING_TRANSACTION, C.ABORTING_TRANSACTION}),
    C.IN_TRANSACTION: frozenset({C.READY}),
    C.COMMITTING_TRANSACTION: frozenset({C.IN_TRANSACTION}),
    C.ABORTING_TRANSACTION: frozenset({C.IN_TRANSACTION, C.ABORTABLE_ERROR}),
    C.ABORTABLE_ERROR: frozenset(
        {C.IN_TRANSACTION, C.COMMITTING_TRANSACTION, C.ABORTABLE_ERROR, C.ABORTING_TRANSACTION}
    ),
    C.FATAL_ERROR: frozenset(ClientTxnState),
}


class TransactionManager:
    """Holds the state and the error that put the producer in an error state."""

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.state = ClientTxnState.UNINITIALIZED
        self.last_error: TxnTableError | None = None
        self._lock = threading.Lock()

    def transition(self, to: ClientTxnState, error: TxnTableError | None = None) -> None:
        """Move to ``to``.

        Raises:
            InvalidTxnStateError: If the move is illegal; the message names both states.
        """
        with self._lock:
            if self.state is ClientTxnState.FATAL_ERROR and to is not ClientTxnState.FATAL_ERROR:
                assert self.last_error is not None
                raise self.last_error
            if self.state not in LEGAL_TRANSITIONS[to]:
                raise InvalidTxnStateError(
                    f"TransactionalId {self.transactional_id}: invalid transition attempted from "
                    f"state {self.state.value} to state {to.value}"
                )
            self.state = to
            if error is not None:
                self.last_error = error
            elif to in (ClientTxnState.READY, ClientTxnState.IN_TRANSACTION):
                self.last_error = None

    def require(self, operation: str, *allowed: ClientTxnState) -> None:
        """Raise unless the state is one of ``allowed`` (the error state's error if any)."""
        state = self.state
        if state in allowed:
            return
        if state in (ClientTxnState.FATAL_ERROR, ClientTxnState.ABORTABLE_ERROR):
            assert self.last_error is not None
            raise self.last_error
        raise InvalidTxnStateError(f"cannot {operation} in state {state.value}")

    def fail(self, error: TxnTableError, fatal: bool) -> None:
        """Enter ABORTABLE_ERROR or FATAL_ERROR because of ``error``.

        A non-fatal error while the transaction is being aborted changes nothing (Kafka's
        ``transitionToAbortableError``): the abort is already what the error calls for.
        """
        with self._lock:
            if self.state is ClientTxnState.FATAL_ERROR:
                return
            if not fatal and self.state is ClientTxnState.ABORTING_TRANSACTION:
                return
            self.state = ClientTxnState.FATAL_ERROR if fatal else ClientTxnState.ABORTABLE_ERROR
            self.last_error = error
