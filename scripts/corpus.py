#!/usr/bin/python3
"""Builds the quickstart's miniature Pile from real text that Debian packages
ship (installed by scripts/setup), as one jsonl with The Pile's fields
({"text": ..., "meta": {"pile_set_name": ...}}):

  fortunes  the fortune cookie files (package fortunes), one fortune a document
  jargon    the Jargon File 4.4.7 (package jargon-text), cut at paragraph
            boundaries into documents of about 2,000 characters
  code      C and C++ headers under /usr/include, one file a document

    scripts/corpus.py OUT.jsonl [--code-mb 3]

Files that are not valid UTF-8 are skipped (and counted); nothing is generated.
"""
import argparse
import glob
import gzip
import json
import os
import re
import sys


def fortunes():
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith((".dat", ".u8")) or os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        for cookie in re.split(r"\n%\n", text):
            cookie = cookie.strip("\n%")
            if cookie.strip():
                yield cookie + "\n"


def jargon():
    text = gzip.open("/usr/share/doc/jargon-text/jargon.txt.gz", "rt", encoding="utf-8").read()
    doc = []
    size = 0
    for para in re.split(r"\n\s*\n", text):
        if not para.strip():
            continue
        doc.append(para.rstrip())
        size += len(para)
        if size >= 2000:
            yield "\n\n".join(doc) + "\n"
            doc, size = [], 0
    if doc:
        yield "\n\n".join(doc) + "\n"


def code(limit_bytes):
    total = 0
    paths = sorted(glob.glob("/usr/include/**/*.h", recursive=True) +
                   glob.glob("/usr/include/**/*.hpp", recursive=True) +
                   glob.glob("/usr/include/c++/**/*", recursive=True))
    for path in paths:
        if not os.path.isfile(path) or os.path.getsize(path) > 200_000:
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        yield text
        total += len(text.encode())
        if total >= limit_bytes:
            return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--code-mb", type=float, default=3.0)
    a = ap.parse_args()
    sizes = {}
    with open(a.out, "w", encoding="utf-8") as f:
        for name, docs in (("fortunes", fortunes()), ("jargon", jargon()),
                           ("code", code(int(a.code_mb * 1e6)))):
            n = b = 0
            for text in docs:
                f.write(json.dumps({"text": text, "meta": {"pile_set_name": name}}, ensure_ascii=False) + "\n")
                n += 1
                b += len(text.encode())
            sizes[name] = (n, b)
    total = sum(b for _, b in sizes.values())
    for name, (n, b) in sizes.items():
        print(f"  {name:9s} {n:7d} documents {b / 1e6:6.2f} MB")
    print(f"  total     {total / 1e6:.2f} MB of text -> {a.out}")
    if total < 5e6:
        sys.exit(f"corpus.py: only {total / 1e6:.2f} MB of text found; are fortunes and jargon-text installed?")


if __name__ == "__main__":
    main()
