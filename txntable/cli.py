"""Command line: ``txntable tables|describe|recover WAREHOUSE ...``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from txntable.errors import TxnTableError
from txntable.warehouse import Warehouse


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--option takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="txntable", description=__doc__)
    parser.add_argument("--option", "-o", action="append", default=[], help="storage KEY=VALUE")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tables", help="list tables")
    p.add_argument("warehouse")
    p = sub.add_parser("describe", help="offsets, LSO and open transactions of a table")
    p.add_argument("warehouse")
    p.add_argument("table")
    p = sub.add_parser("recover", help="finish prepared and abort timed-out transactions")
    p.add_argument("warehouse")
    p = sub.add_parser("vacuum", help="delete a table's unreferenced old segment files")
    p.add_argument("warehouse")
    p.add_argument("table")
    p.add_argument("--retention-hours", type=float, default=168.0)
    p.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    try:
        wh = Warehouse(args.warehouse, storage_options=_options(args.option))
        if args.command == "tables":
            print("\n".join(wh.list_tables()))
        elif args.command == "describe":
            print(json.dumps(asdict(wh.table(args.table).describe()), indent=2))
        elif args.command == "vacuum":
            retention_ms = int(args.retention_hours * 3600 * 1000)
            vacuumed = wh.table(args.table).vacuum(retention_ms, dry_run=args.dry_run)
            print(json.dumps(asdict(vacuumed), indent=2))
        else:
            report = wh.recover()
            print(json.dumps(asdict(report), indent=2))
            if report.failed:
                return 1
    except TxnTableError as e:
        print(f"txntable: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
