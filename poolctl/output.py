"""What poolctl prints: aligned tables and `key: value` blocks for people, JSON for scripts."""

from __future__ import annotations

import json
import sys

MISSING = "-"


def empty(value) -> bool:
    return value is None or value == "" or value == [] or value == {}


def cell(value, nested: bool = False) -> str:
    """One value as a short string: timestamps to the second, objects as key=value (braced
    when inside another)."""
    if empty(value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        if len(value) >= 19 and value[4] == "-" and value[10] == "T":  # ISO 8601 time
            return value[:19].replace("T", " ")
        return value
    if isinstance(value, dict):
        text = " ".join(f"{key}={cell(item, True)}" for key, item in value.items())
        return f"{{{text}}}" if nested else text
    if isinstance(value, list):
        return ",".join(cell(item, True) for item in value)
    return str(value)


def table(rows: list[dict], columns: list[tuple[str, str]] | None = None, out=None) -> None:
    """`columns`: (header, key) pairs; a key may be dotted (`held.cpu_millicores`) or a
    callable of the row. Without columns, every key of the rows, in order of appearance."""
    out = out or sys.stdout
    if columns is None:
        keys = list(dict.fromkeys(key for row in rows for key in row))
        columns = [(key.upper(), key) for key in keys]
    if not rows:
        print("(none)", file=out)
        return
    cells = [[cell(_pick(row, key)) for _, key in columns] for row in rows]
    headers = [header for header, _ in columns]
    widths = [max(len(text) for text in column) for column in zip(headers, *cells, strict=True)]
    for line in [headers, *cells]:
        print(
            "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip(),
            file=out,
        )


def details(item: dict, keys: list[str] | None = None, out=None) -> None:
    """One object as `key: value` lines; nested objects indented below their key."""
    out = out or sys.stdout
    keys = keys or list(item)
    flat = [key for key in keys if not (isinstance(item.get(key), dict) and item.get(key))]
    width = max((len(key) for key in flat), default=0)
    for key in keys:
        value = item.get(key)
        if isinstance(value, dict) and value:
            print(f"{key}:", file=out)
            for inner, inner_value in value.items():
                if not empty(inner_value):  # a resource request names its few set fields
                    print(f"  {inner}: {cell(inner_value)}", file=out)
        else:
            print(f"{key.ljust(width)}  {cell(value)}", file=out)


def as_json(data, out=None) -> None:
    print(json.dumps(data, indent=2, sort_keys=False), file=out or sys.stdout)


def json_line(data, out=None) -> None:
    """One JSON document per line (watch --json): a script reads it as it comes."""
    print(json.dumps(data, separators=(",", ":")), file=out or sys.stdout, flush=True)


def _pick(row: dict, key):
    if callable(key):
        return key(row)
    value = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
