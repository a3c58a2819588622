#!/usr/bin/python3
"""Makes the tokenizer test's fixture: a varied text of more than 1 MB and its
ids under tiktoken's `gpt2` encoding, computed by js-tiktoken@1.0.21 (fetched by
scripts/setup into .cache/npm).

The text mixes, in a seeded order: English prose (licenses, the Jargon File,
fortunes shipped by Debian), code (C headers, Python's standard library),
numbers, words in many scripts (with combining marks), emoji (skin tones,
ZWJ sequences, flags, variation selectors), odd whitespace, contractions, and
"<|endoftext|>" as plain text. U+0085 and U+FEFF are left out: there
js-tiktoken's JavaScript \\s differs from Python/Rust tiktoken (the reference
troupe follows); tests/model/bpe_test.cc checks those by hand.

    /usr/bin/python3 tests/reference/make_bpe_fixture.py tests/reference/data
writes bpe_corpus.txt and bpe_corpus.ids (u16 little-endian).
"""
import glob
import gzip
import json
import os
import random
import subprocess
import sys
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
rng = random.Random(20261129)


def read(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return f.read(limit).replace("\ufffd", "?")


def prose():
    parts = [read(p, 60_000) for p in sorted(glob.glob("/usr/share/common-licenses/*"))[:6]
             if os.path.isfile(p)]
    parts.append(read("/usr/share/doc/jargon-text/jargon.txt.gz", 250_000))
    for name in ("fortunes", "computers", "science", "linux"):
        p = f"/usr/share/games/fortunes/{name}"
        if os.path.exists(p):
            parts.append(read(p, 60_000))
    return parts


def code():
    files = sorted(glob.glob("/usr/include/*.h"))[:40] + sorted(glob.glob("/usr/lib/python3.11/*.py"))[:15]
    return [read(p, 8_000) for p in files]


def numbers():
    out = []
    for _ in range(3000):
        k = rng.randrange(8)
        if k == 0:
            out.append(str(rng.randrange(10 ** rng.randrange(1, 25))))
        elif k == 1:
            out.append(f"{rng.uniform(-1e6, 1e6):.{rng.randrange(0, 9)}f}")
        elif k == 2:
            out.append(f"{rng.uniform(0, 1):.3e}")
        elif k == 3:
            out.append(f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}")
        elif k == 4:
            out.append(f"+{rng.randrange(1, 99)} {rng.randrange(100, 999)} {rng.randrange(1000, 9999)}")
        elif k == 5:
            out.append("".join(rng.choice("0123456789") for _ in range(rng.randrange(30, 120))))
        elif k == 6:
            out.append(f"{rng.randrange(1000):,}".replace(",", rng.choice([",", ".", " ", "\u00a0"])) + f"{rng.randrange(10**6):,}")
        else:
            out.append(rng.choice(["½", "²", "Ⅻ", "٣٤٥", "१२३", "一二三", "①②"]) + str(rng.randrange(100)))
    return [" ".join(out[i:i + 20]) + "\n" for i in range(0, len(out), 20)]


SCRIPTS = [(0x00C0, 0x024F), (0x0370, 0x03FF), (0x0400, 0x04FF), (0x0530, 0x058F), (0x05D0, 0x05EA),
           (0x0620, 0x064A), (0x0900, 0x097F), (0x0980, 0x09FF), (0x0B80, 0x0BFF), (0x0E00, 0x0E5B),
           (0x10A0, 0x10FF), (0x1100, 0x11FF), (0x1200, 0x137F), (0x13A0, 0x13F4), (0x3041, 0x3096),
           (0x30A1, 0x30FA), (0x4E00, 0x9FA5), (0xAC00, 0xD7A3), (0x0E80, 0x0EDF), (0x1780, 0x17F9)]


def script_words():
    out = []
    for lo, hi in SCRIPTS:
        chars = [chr(c) for c in range(lo, hi + 1)
                 if unicodedata.category(chr(c))[0] in "LMN" and unicodedata.name(chr(c), "")]
        for _ in range(400):
            word = "".join(rng.choice(chars) for _ in range(rng.randrange(1, 9)))
            out.append(word + rng.choice([" ", " ", " ", ", ", ". ", "\n", "。", "، "]))
    rng.shuffle(out)
    return ["".join(out[i:i + 50]) for i in range(0, len(out), 50)]


def emoji():
    base = [chr(c) for r in [(0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6C5), (0x1F910, 0x1F93E)]
            for c in range(r[0], r[1] + 1) if unicodedata.name(chr(c), "")]
    tones = [chr(c) for c in range(0x1F3FB, 0x1F400)]
    zwj = ["👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "👩🏽\u200d💻", "❤\ufe0f", "☺\ufe0e"]
    flags = ["🇫🇷", "🇯🇵", "🇧🇷", "🇺🇳", "🇪🇺"]
    out = []
    for _ in range(6000):
        k = rng.randrange(6)
        e = rng.choice(base) + (rng.choice(tones) if k == 0 else "")
        if k == 1:
            e = rng.choice(zwj)
        elif k == 2:
            e = rng.choice(flags)
        out.append(e + rng.choice(["", " ", "  ", "!", " wow ", "\n"]))
    return ["".join(out[i:i + 100]) for i in range(0, len(out), 100)]


WS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\v", "\f", "\u00a0", "\u2003", "\u3000",
      "\u2028", "\u2029", "\u200b", "\u180e", " \n", "  \t \n", "\u202f", "\u205f", "\u1680"]
WORDS = ["it's", "IT'S", "we're", "They'VE", "I'm", "you'll", "he'd", "can't", "dont'", "'s", "'",
         "rock'n'roll", "don’t", "<|endoftext|>", "<|endoftext", "|>", "foo.bar()", "x=1;y=2",
         "==>", "#!/bin/sh", "~~~", "...", "hello", "Hello", "HELLO", "naïve", "café", "Ⅷ", "x²"]


def odd():
    out = []
    for _ in range(30000):
        out.append(rng.choice(WORDS) + rng.choice(WS))
    return ["".join(out[i:i + 200]) for i in range(0, len(out), 200)]


def main(out_dir):
    pieces = prose() + code() + numbers() + script_words() + emoji() + odd()
    rng.shuffle(pieces)
    text = "".join(pieces).replace("\u0085", " ").replace("\ufeff", " ")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bpe_corpus.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    tiktoken = os.path.join(ROOT, ".cache/npm/node_modules/js-tiktoken/dist/index.cjs")
    js = ("const {getEncoding}=require(process.argv[1]);const fs=require('fs');"
          "const t=fs.readFileSync(process.argv[2],'utf8');"
          "const ids=getEncoding('gpt2').encode(t,[],[]);"
          "const b=Buffer.alloc(ids.length*2);ids.forEach((x,i)=>b.writeUInt16LE(x,i*2));"
          "fs.writeFileSync(process.argv[3],b);console.log(ids.length);")
    n = subprocess.run(["node", "-e", js, tiktoken, path, os.path.join(out_dir, "bpe_corpus.ids")],
                       check=True, capture_output=True, text=True).stdout.strip()
    print(f"{len(text.encode())} bytes, {len(text)} characters, {n} tokens")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "data"))
