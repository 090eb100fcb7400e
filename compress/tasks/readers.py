"""Readers for the file formats the tasks use. Every problem becomes a DataError naming file and line."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

from compress.core.errors import DataError

csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def read_text(path: Path, encoding: str = "utf-8") -> str:
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        return path.read_text(encoding=encoding)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid {encoding} text at byte {exc.start} "
                        "(re-save the file as UTF-8)") from None


def read_delimited(path: Path, delimiter: str, header: bool = True, quoting: int = csv.QUOTE_MINIMAL
                   ) -> tuple[list[str] | None, list[list[str]], list[int]]:
    """Rows of a CSV/TSV file; the header (if any) separately; and the file line (1-based, the header
    is line 1) where each row starts, for error messages. Blank lines are skipped; a quoted field
    may span lines. Empty files are an error."""
    text = read_text(path, encoding="utf-8-sig")
    if not text.strip():
        raise DataError(f"{path} is empty (expected a header and data rows)")
    rows, lines = [], []
    try:
        # A file object with newline="" (not str.splitlines, which also breaks at U+0085, U+2028 and
        # other characters that are ordinary text inside a field) keeps quoted newlines in their field.
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting)
        ended = 0  # the line where the previous row ended
        for r in reader:
            if r:
                rows.append(r)
                lines.append(ended + 1)
            ended = reader.line_num
    except csv.Error as exc:
        raise DataError(f"{path}: malformed {'TSV' if delimiter == chr(9) else 'CSV'}: {exc}") from None
    head = rows.pop(0) if header else None
    if header:
        lines.pop(0)
    if header and not rows:
        raise DataError(f"{path} has a header but no data rows")
    if head is not None:
        width = len(head)
        for line, r in zip(lines, rows):
            if len(r) != width:
                raise DataError(f"{path}:{line}: expected {width} columns as in the header, got {len(r)}")
    return head, rows, lines


def column(head: list[str], name: str, path: Path) -> int:
    if name not in head:
        raise DataError(f"{path}: no column '{name}'; columns are {head} "
                        "(choose with --text-column/--text-pair-column/--label-column)")
    return head.index(name)


def read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """(file line, object) for each non-blank line of a JSON Lines file; a UTF-8 BOM is allowed, as
    in CSV files."""
    text = read_text(path, encoding="utf-8-sig")
    records = []
    for i, line in enumerate(text.split("\n"), start=1):  # JSON strings may hold U+2028 etc. raw
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{i}: each line must be a JSON object")
        records.append((i, rec))
    if not records:
        raise DataError(f"{path} is empty (expected one JSON object per line)")
    return records
