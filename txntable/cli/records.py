"""How records are written as lines of text: what ``produce`` reads and ``consume`` prints.

Keys, values and headers are bytes, written as UTF-8 text, base64 or hex (``--encoding``).
A typed table's record is one JSON object of its columns, with dates and timestamps as
ISO-8601 text, decimals as text and binary values in the encoding.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from txntable.protocol.schema import TypedLayout

ENCODINGS = ("utf-8", "base64", "hex")
#: Floats JSON has no number for, as text (the names of JavaScript, Protocol Buffers'
#: JSON mapping and Spark's JSON reader).
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def decode_text(text: str, encoding: str, what: str) -> bytes:
    """Bytes from a key or value written as text in ``encoding``.

    Raises:
        ValueError: Not valid base64 or hex.
    """
    try:
        if encoding == "base64":
            return base64.b64decode(text, validate=True)
        if encoding == "hex":
            return bytes.fromhex(text)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"{what} is not valid {encoding}: {e}") from None
    return text.encode()


def value_from_json(v: Any, t: pa.DataType, decode_binary: Callable[[str], bytes]) -> Any:
    """A JSON value as the Python value ``send`` takes for type ``t``: ISO-8601 text for
    dates and timestamps (or integers of the unit), text or numbers for decimals, text in
    the CLI's encoding for binary, ``"NaN"``/``"Infinity"``/``"-Infinity"`` for floats, an
    object (keys as text) or a list of pairs for a map; lists, objects and ``null`` as they
    are.

    Raises:
        ValueError: A value that cannot be read as ``t``.
    """
    from pyarrow import types as pa_types

    if v is None:
        return None
    if pa_types.is_binary(t):
        if not isinstance(v, str):
            raise ValueError(f"expected text for a binary value, got {type(v).__name__}")
        return decode_binary(v)
    if pa_types.is_date(t) and isinstance(v, str):
        return datetime.date.fromisoformat(v)
    if pa_types.is_timestamp(t) and isinstance(v, str):
        parsed = datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
        if t.tz is not None and parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=datetime.UTC)
        return parsed
    if pa_types.is_floating(t) and isinstance(v, str) and v in NON_FINITE:
        return NON_FINITE[v]
    if pa_types.is_decimal(t) and isinstance(v, str | int | float) and not isinstance(v, bool):
        try:
            return decimal.Decimal(str(v))
        except decimal.InvalidOperation:
            raise ValueError(f"{v!r} is not a decimal number") from None
    if pa_types.is_list(t) and isinstance(v, list):
        return [value_from_json(x, t.value_type, decode_binary) for x in v]
    if pa_types.is_map(t) and isinstance(v, dict):
        return [
            (_key_from_text(k, t.key_type, decode_binary),
             value_from_json(x, t.item_type, decode_binary))
            for k, x in v.items()
        ]  # fmt: skip
    if pa_types.is_map(t) and isinstance(v, list):
        pairs = []
        for pair in v:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"a map entry is a [key, value] pair, not {pair!r:.40}")
            pairs.append(
                (value_from_json(pair[0], t.key_type, decode_binary),
                 value_from_json(pair[1], t.item_type, decode_binary))
            )  # fmt: skip
        return pairs
    if pa_types.is_struct(t) and isinstance(v, dict):
        fields = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        return {
            k: value_from_json(x, fields[k], decode_binary) if k in fields else x
            for k, x in v.items()
        }
    return v


def _key_from_text(text: str, t: pa.DataType, decode_binary: Callable[[str], bytes]) -> Any:
    """A map key written as a JSON object's key (always text) as a value of type ``t``."""
    from pyarrow import types as pa_types

    if pa_types.is_integer(t):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"map key {text!r} is not an integer") from None
    if pa_types.is_floating(t):
        if text in NON_FINITE:
            return NON_FINITE[text]
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"map key {text!r} is not a number") from None
    if pa_types.is_boolean(t):
        if text not in ("true", "false"):
            raise ValueError(f"map key {text!r} is not true or false")
        return text == "true"
    return value_from_json(text, t, decode_binary)


def record_from_json(
    obj: Mapping[str, Any], layout: TypedLayout, decode_binary: Callable[[str], bytes]
) -> dict[str, Any]:
    """A JSON object's user columns as a record for ``send`` (unknown names are kept, for
    ``send`` to refuse by name).

    Raises:
        ValueError: A value that cannot be read as its column's type (the message names it).
    """
    out: dict[str, Any] = {}
    for name, v in obj.items():
        if name in layout.schema.names:
            try:
                out[name] = value_from_json(v, layout.schema.field(name).type, decode_binary)
            except (ValueError, TypeError) as e:
                raise ValueError(f"column {name!r}: {e}") from None
        else:
            out[name] = v
    return out


def value_to_json(v: Any, t: pa.DataType, encode_binary: Callable[[bytes], str]) -> Any:
    """A value of type ``t`` read from a typed table as JSON, what :func:`value_from_json`
    reads back as the same value: dates and timestamps as ISO-8601, decimals as text,
    binary in the CLI's encoding, non-finite floats as text, a map as an object whose keys
    are the keys' text.

    Raises:
        ValueError: ``encode_binary`` could not write a binary value.
    """
    from pyarrow import types as pa_types

    if v is None:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, datetime.date | datetime.datetime):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, bytes):
        return encode_binary(v)
    if pa_types.is_map(t):
        return {
            _key_text(value_to_json(k, t.key_type, encode_binary)):
                value_to_json(x, t.item_type, encode_binary)
            for k, x in v
        }  # fmt: skip
    if pa_types.is_list(t):
        return [value_to_json(x, t.value_type, encode_binary) for x in v]
    if pa_types.is_struct(t):
        types = {t.field(i).name: t.field(i).type for i in range(t.num_fields)}
        return {k: value_to_json(x, types[k], encode_binary) for k, x in v.items()}
    return v


def _key_text(key: Any) -> str:
    """A map key's JSON value as an object key: text as it is, numbers and booleans as
    their JSON."""
    return key if isinstance(key, str) else json.dumps(key)


def encode_bytes(data: bytes | None, encoding: str, where: str) -> str | None:
    """Bytes as text in ``encoding`` (``None`` stays ``None``).

    Raises:
        ValueError: UTF-8 asked for bytes that are not UTF-8 (``where`` names them).
    """
    if data is None:
        return None
    if encoding == "base64":
        return base64.b64encode(data).decode()
    if encoding == "hex":
        return data.hex()
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not UTF-8; use --encoding base64 or hex") from None
