"""Plain-text corpora: the files of ``--corpus``, ``--calibration-data`` and the embedding task's
unlabelled text, one text per non-blank line."""

from __future__ import annotations

from pathlib import Path

from compress.core.errors import DataError

TEXT_SUFFIXES = (".txt", ".raw", ".tokens")


def corpus_files(paths: tuple[str, ...] | list[str], flag: str = "--corpus") -> list[Path]:
    """Expand ``--corpus`` entries: files as given, folders to their text files (sorted, recursive).
    ``flag``: the option the paths came from, named in the errors."""
    if not paths:
        raise DataError("--stage pretrain needs --corpus: a text file, several (a,b) or a folder of "
                        f"{'/'.join(TEXT_SUFFIXES)} files (e.g. ../shared/data/wikitext2)")
    what = "corpus" if flag == "--corpus" else flag
    files: list[Path] = []
    for entry in paths:
        p = Path(entry).expanduser()
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES)
            if not found:
                raise DataError(f"{what} folder {p} has no text files ({', '.join(TEXT_SUFFIXES)}); "
                                "pass a folder holding some, or the files themselves")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise DataError(f"{what} not found: {p} (pass an existing file or folder to {flag})")
    return files


def read_corpus(paths: tuple[str, ...] | list[str], flag: str = "--corpus") -> list[str]:
    """Non-blank lines of every corpus file, in order (``flag``: the option named in the errors)."""
    what = "corpus" if flag == "--corpus" else flag
    lines: list[str] = []
    for f in corpus_files(paths, flag):
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{what} file {f} is not UTF-8 text") from None
        lines.extend(ln.strip() for ln in text.splitlines() if ln.strip())
    if not lines:
        raise DataError(f"the {what} ({', '.join(map(str, paths))}) is empty: no non-blank line")
    return lines
