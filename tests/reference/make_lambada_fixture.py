#!/usr/bin/python3
"""Writes tests/reference/data/lambada_gpl3.jsonl: passages in LAMBADA's
format ({"text": passage}, the passage ending with the word to predict, no
final punctuation), cut from Debian's copy of the GNU GPL version 3
(/usr/share/common-licenses/GPL-3, base-files). Each paragraph of at least
25 words gives one passage: its first 60 words at most, shortened until the
last one is a word of letters.

  /usr/bin/python3 tests/reference/make_lambada_fixture.py
"""
import json
import os
import re

SOURCE = "/usr/share/common-licenses/GPL-3"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lambada_gpl3.jsonl")


def passages(text, limit=40):
    for para in re.split(r"\n\s*\n", text):
        words = para.split()
        if len(words) < 25:
            continue
        words = words[:60]
        while words and not re.fullmatch(r"[A-Za-z]{2,}", words[-1].rstrip(".,;:!?\"')")):
            words.pop()
        if len(words) < 20:
            continue
        words[-1] = words[-1].rstrip(".,;:!?\"')")
        yield " ".join(words)
        limit -= 1
        if limit == 0:
            return


def main():
    with open(SOURCE, encoding="utf-8") as f:
        text = f.read()
    rows = list(passages(text))
    with open(OUT, "w", encoding="utf-8") as f:
        for p in rows:
            f.write(json.dumps({"text": p}) + "\n")
    print(f"{OUT}: {len(rows)} passages")


if __name__ == "__main__":
    main()
