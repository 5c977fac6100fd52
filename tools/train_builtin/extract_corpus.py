#!/usr/bin/env python3
"""Extracts the public-domain English the built-in model learns from, as JSON lines.

Sources (Debian packages; both texts are in the public domain, see README.md):
- dict-devil: Ambrose Bierce, "The Devil's Dictionary" (1911; copyright expired), read from
  /usr/share/dictd/devil.dict.dz -> {"kind": "definition", "word", "text"}.
- bible-kjv: the King James Version (1611), printed by its `bible` program
  -> {"kind": "verse", "ref", "text"}.
Standard library only.
"""
import gzip
import json
import re
import subprocess
import sys

BOOKS = {"Ge": "Genesis", "Exo": "Exodus", "Ruth": "Ruth", "Job": "Job", "Psa": "Psalms",
         "Prv": "Proverbs", "Eccl": "Ecclesiastes", "SSol": "Song of Solomon", "Isa": "Isaiah",
         "Mat": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John", "Acts": "Acts",
         "Rom": "Romans", "1Cor": "1 Corinthians", "Jas": "James", "Rev": "Revelation"}


def devil():
    text = gzip.open("/usr/share/dictd/devil.dict.dz", "rt", encoding="latin-1").read()
    start = text.find("ABASEMENT, n.")
    for para in re.split(r"\n\s*\n", text[start:]):
        m = re.match(r"([A-Z][A-Z' -]+), ([a-z.]+)\s+(.*)", para, re.S)
        if not m:
            continue
        body = re.sub(r"\s+", " ", m.group(3)).strip()
        body = re.sub(r"[{}\[\]_]", "", body)
        if body and body.isascii():
            yield {"kind": "definition", "word": m.group(1).strip().title(), "text": body}


def kjv():
    out = subprocess.run(["bible", "-f", "Ge1:1-Re22:21"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        m = re.match(r"([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)", line)
        if not m or m.group(1) not in BOOKS:
            continue
        yield {"kind": "verse", "ref": f"{BOOKS[m.group(1)]} {m.group(2)}:{m.group(3)}", "text": m.group(4).strip()}


if __name__ == "__main__":
    n = 0
    for u in list(devil()) + list(kjv()):
        sys.stdout.write(json.dumps(u) + "\n")
        n += 1
    print(f"extract_corpus: {n} units", file=sys.stderr)
