"""JSONL in and out for the predictor subcommands: scenarios in, predictions out (or stdout)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tightfit.errors import TightfitError


def read_jsonl(path: str) -> list[Any]:
    """Rows of a JSONL file ('-' = stdin); a line that is not JSON becomes a row error later."""
    if path != "-" and Path(path).is_dir():
        raise TightfitError(f"--input {path!r} is a directory; give a JSONL file of scenarios")
    if path != "-" and not Path(path).is_file():
        raise TightfitError(f"--input {path!r} does not exist; give a JSONL file of scenarios")
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    if b"\0" in data:
        raise TightfitError(f"--input {path!r} is not a text file (it holds NUL bytes); give a "
                            "JSONL file of scenarios, one JSON object a line")
    rows: list[Any] = []
    for n, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            rows.append({"id": f"line-{n}", "_parse_error": f"line {n} is not UTF-8 text "
                         f"(byte {raw[exc.start]:#04x} at column {exc.start + 1})"})
            continue
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            rows.append({"id": f"line-{n}", "_parse_error": f"line {n} is not JSON ({exc.msg})"})
    if not rows:
        raise TightfitError(f"--input {path!r} holds no scenarios; write one JSON object a line")
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | None) -> None:
    write_text("".join(json.dumps(r, sort_keys=False) + "\n" for r in rows), path)


def write_text(text: str, path: str | None) -> None:
    """`text` to the file at `path` (an --output), else to stdout."""
    if path:
        try:
            Path(path).write_text(text)
        except OSError as exc:
            raise TightfitError(f"--output {path!r} cannot be written ({exc.strerror}); give a "
                                "file path in a directory that exists and you can write to"
                                ) from None
    else:
        sys.stdout.write(text)
