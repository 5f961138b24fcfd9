"""JSONL in and out for the predictor subcommands: scenarios in, predictions out (or stdout)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tightfit.errors import TightfitError


def read_jsonl(path: str) -> list[Any]:
    """Rows of a JSONL file ('-' = stdin); a line that is not JSON becomes a row error later."""
    if path != "-" and not Path(path).is_file():
        raise TightfitError(f"--input {path!r} does not exist; give a JSONL file of scenarios")
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    rows: list[Any] = []
    for n, line in enumerate(text.splitlines(), 1):
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
    text = "".join(json.dumps(r, sort_keys=False) + "\n" for r in rows)
    if path:
        Path(path).write_text(text)
    else:
        sys.stdout.write(text)
