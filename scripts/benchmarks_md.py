"""Replace one named section of BENCHMARKS.md, leaving the others as they are.

Each benchmark script owns the text between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

__all__ = ["update_benchmarks_section", "BENCHMARKS_PATH"]

BENCHMARKS_PATH = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"
_HEADER = "# Benchmarks\n\nEach section is written by the script it names; rerun that command to refresh it.\n"


def update_benchmarks_section(name: str, title: str, command: str, body: str, path: Path = BENCHMARKS_PATH) -> None:
    """Write section ``name`` of BENCHMARKS.md with its title, reproducing command, today's date and body."""
    text = path.read_text(encoding="utf-8") if path.exists() else _HEADER
    date = datetime.date.today().isoformat()
    section = (
        f"<!-- bench:{name} -->\n## {title}\n\n"
        f"Command: `{command}`  \nDate: {date}\n\n{body.rstrip()}\n<!-- /bench:{name} -->\n"
    )
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _match: section, text)
    else:
        text = text.rstrip() + "\n\n" + section
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
