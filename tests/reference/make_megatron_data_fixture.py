#!/usr/bin/env python3
"""Reference datasets and sample indices from Megatron-LM's own code.

Runs, from a Megatron-LM snapshot (a git directory, e.g. the one the `fetch`
tool leaves under /work/.mirror/NVIDIA+Megatron-LM/repo; nothing of it is
copied into troupe), these unmodified pieces:

- tools/preprocess_data.py's Encoder.encode and the IndexedDatasetBuilder
  calls of its process_json_file (add_document(ids, lens), finalize) on
  data/megatron_empty_docs.jsonl with --append-eod, which holds documents
  whose text is empty. The tokenizer is GPT-2's BPE as js-tiktoken@1.0.21
  computes it (the reference troupe's BPE is tested against), since Megatron's
  build_tokenizer needs packages Debian does not ship;
- megatron/core/datasets/indexed_dataset.py's add_item/end_document writing
  zero-length sequences and a document with no sequence;
- megatron/core/datasets/helpers.cpp's build_sample_idx (compiled here with
  Debian's pybind11) on sequence lengths that include zeros.

Writes into OUT_DIR:
  megatron_empty_docs_text_document.{bin,idx}   preprocess_data.py's output
  megatron_zero_length.{bin,idx}                 zero-length sequences
  megatron_sample_idx.txt                        build_sample_idx cases
  megatron_commit.txt                            the snapshot's commit

  /usr/bin/python3 tests/reference/make_megatron_data_fixture.py \
      /work/.mirror/NVIDIA+Megatron-LM/repo tests/reference/data
"""
import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EOD = 50256  # GPT-2's <|endoftext|>
VOCAB_SIZE = 50257

# Documents of the preprocess case: empty texts at the start, in a row, alone
# and at the end; whitespace that is not empty (it has tokens).
DOCUMENTS = ["", "Hello world", "", "", "The quick brown fox.", " ", "", "a\nb", ""]

# build_sample_idx cases: (sequence lengths, seq_length T, epochs). The first
# ends a sample exactly at a document's end followed by empty documents.
SAMPLE_CASES = [
    ([5, 0, 3, 0, 0, 8, 2, 0, 4], 4, 2),
    ([0, 4, 0, 4, 0], 4, 3),
    ([1, 0, 1, 0, 1, 1, 0, 0, 3], 2, 2),
    ([3, 0, 0, 2, 7, 0, 1], 3, 1),
]


def load_megatron(src):
    """Imports indexed_dataset.py and preprocess_data.py without the
    megatron/__init__ chain (which needs packages Debian does not ship)."""
    def package(name, path):
        m = types.ModuleType(name)
        m.__path__ = [path]
        sys.modules[name] = m
        return m

    package("megatron", os.path.join(src, "megatron"))
    package("megatron.core", os.path.join(src, "megatron/core"))
    package("megatron.core.datasets", os.path.join(src, "megatron/core/datasets"))
    utils = types.ModuleType("megatron.core.utils")  # only log_single_rank is used
    utils.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules["megatron.core.utils"] = utils
    # preprocess_data.py's imports for the tokenizer and its flags, unused
    # here: Encoder.tokenizer is set directly.
    for name in ["megatron.core.tokenizers", "megatron.core.tokenizers.utils",
                 "megatron.core.tokenizers.utils.build_tokenizer", "megatron.training",
                 "megatron.training.arguments"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["megatron.core.tokenizers.utils.build_tokenizer"].build_tokenizer = None
    sys.modules["megatron.training.arguments"]._add_tokenizer_args = None
    from megatron.core.datasets import indexed_dataset
    spec = importlib.util.spec_from_file_location("preprocess_data",
                                                  os.path.join(src, "tools/preprocess_data.py"))
    preprocess_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(preprocess_data)
    return indexed_dataset, preprocess_data


def tiktoken_ids(texts):
    tiktoken = os.path.join(ROOT, ".cache/npm/node_modules/js-tiktoken/dist/index.cjs")
    js = ("const {getEncoding}=require(process.argv[1]);const e=getEncoding('gpt2');"
          "const t=JSON.parse(require('fs').readFileSync(0,'utf8'));"
          "console.log(JSON.stringify(t.map(s=>e.encode(s,[],[]))));")
    out = subprocess.run(["node", "-e", js, tiktoken], input=json.dumps(texts), check=True,
                         capture_output=True, text=True).stdout
    return dict(zip(texts, json.loads(out)))


class Tokenizer:
    def __init__(self, ids):
        self.ids, self.eod, self.vocab_size = ids, EOD, VOCAB_SIZE

    def tokenize(self, text):
        return self.ids[text]


def preprocess_case(indexed_dataset, preprocess_data, out_dir):
    jsonl = os.path.join(out_dir, "megatron_empty_docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for text in DOCUMENTS:
            f.write(json.dumps({"text": text}) + "\n")
    args = argparse.Namespace(json_keys=["text"], split_sentences=False, append_eod=True)
    encoder = preprocess_data.Encoder(args)
    preprocess_data.Encoder.tokenizer = Tokenizer(tiktoken_ids(DOCUMENTS))
    preprocess_data.Encoder.splitter = preprocess_data.IdentitySplitter()
    prefix = os.path.join(out_dir, "megatron_empty_docs_text_document")
    # As process_json_file: one builder per key, add_document per line.
    builder = indexed_dataset.IndexedDatasetBuilder(
        prefix + ".bin", dtype=indexed_dataset.DType.optimal_dtype(VOCAB_SIZE))
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            doc, sentence_lens, _ = encoder.encode(line)
            builder.add_document(doc["text"], sentence_lens["text"])
    builder.finalize(prefix + ".idx")


def zero_length_case(indexed_dataset, out_dir):
    import numpy
    import torch
    prefix = os.path.join(out_dir, "megatron_zero_length")
    builder = indexed_dataset.IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    # Documents: [3 tokens, 0 tokens], [], [0 tokens], [2 tokens].
    builder.add_item(torch.tensor([7, 8, 9]))
    builder.add_item(torch.tensor([], dtype=torch.int64))
    builder.end_document()
    builder.end_document()
    builder.add_item(torch.tensor([], dtype=torch.int64))
    builder.end_document()
    builder.add_item(torch.tensor([10, 11]))
    builder.end_document()
    builder.finalize(prefix + ".idx")


def build_helpers(src, tmp):
    # Debian's pybind11-dev puts its headers in /usr/include/pybind11.
    out = os.path.join(tmp, "helpers_cpp" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["g++", "-O2", "-shared", "-std=c++17", "-fPIC",
                    "-I" + sysconfig.get_paths()["include"],
                    os.path.join(src, "megatron/core/datasets/helpers.cpp"), "-o", out],
                   check=True)
    spec = importlib.util.spec_from_file_location("helpers_cpp", out)
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    return helpers


def sample_idx_case(helpers, out_dir):
    import numpy
    lines = ["# build_sample_idx_int32(sizes, document_index, T, epochs, tokens, True, 1);",
             "# document_index is 0..n-1 repeated for each epoch (no shuffle)."]
    for sizes, T, epochs in SAMPLE_CASES:
        s = numpy.array(sizes, dtype=numpy.int32)
        doc_idx = numpy.tile(numpy.arange(len(sizes), dtype=numpy.int32), epochs)
        idx = helpers.build_sample_idx_int32(s, doc_idx, T, epochs, int(s.sum()), True, 1)
        lines.append(f"case T={T} epochs={epochs}")
        lines.append("sizes " + " ".join(map(str, sizes)))
        lines.append("sample_idx " + " ".join(str(int(v)) for v in idx.reshape(-1)))
    with open(os.path.join(out_dir, "megatron_sample_idx.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    git_dir, out_dir = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.WARNING)
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "--git-dir", git_dir, "archive", "HEAD", "megatron",
                                  "tools/preprocess_data.py"], check=True, capture_output=True)
        subprocess.run(["tar", "x", "-C", tmp], input=archive.stdout, check=True)
        indexed_dataset, preprocess_data = load_megatron(tmp)
        preprocess_case(indexed_dataset, preprocess_data, out_dir)
        zero_length_case(indexed_dataset, out_dir)
        sample_idx_case(build_helpers(tmp, tmp), out_dir)
    with open(os.path.join(out_dir, "megatron_commit.txt"), "w") as f:
        f.write(commit + "\n")
    print(f"Megatron-LM {commit}: fixtures in {out_dir}")


if __name__ == "__main__":
    main()
