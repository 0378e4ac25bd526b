"""Validation of table, group and transactional-id names (they become storage keys)."""

from __future__ import annotations

import re

from txntable.errors import InvalidTableNameError

#: Kafka's legal topic characters and length limit.
MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[A-Za-z0-9._-]+$")


def validate_table_name(name: str) -> str:
    """Return ``name`` if it is a legal table name.

    Raises:
        InvalidTableNameError: If it is empty, too long, ``.``/``..``, starts with ``_``
            (reserved for ``_coordinator`` and ``_groups``) or has a character outside
            ``[A-Za-z0-9._-]`` (so ``/`` can never escape the warehouse root).
    """
    if not isinstance(name, str) or not name:
        raise InvalidTableNameError("table name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTableNameError(f"table name longer than {MAX_NAME_LENGTH} characters")
    if name in (".", "..") or name.startswith("_") or not _LEGAL.match(name):
        raise InvalidTableNameError(
            f"illegal table name {name!r}: use [A-Za-z0-9._-], not '.', '..' or a leading '_'"
        )
    return name


def validate_id(kind: str, name: str) -> str:
    """Validate a group id or transactional id, which is embedded in a storage key."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise InvalidTableNameError(f"{kind} must be a non-empty string of at most 249 chars")
    if name in (".", "..") or not _LEGAL.match(name):
        raise InvalidTableNameError(f"illegal {kind} {name!r}: use [A-Za-z0-9._-]")
    return name
