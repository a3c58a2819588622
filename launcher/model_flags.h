// The flags that name a trained model and how to run it, shared by
// `troupe generate`, `troupe eval` and `troupe serve`: its weights
// (--weights FILE.safetensors, or --load CKPT, a checkpoint), the layout
// (--tp, --pp), where and in what it computes (--device with train's
// default, --bf16 or --fp16), threads, and the GPT-2 BPE vocabulary
// (Megatron's --vocab-file, --merge-file).
//
//   ModelFlags f;
//   add_model_flags(cmd, f);
//   ...parse...
//   absl::StatusOr<LoadedModel> m = load_model(f);   // errors name the flag or file
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "actors/runtime/inference.h"
#include "api/train_flags.h"
#include "model/data/bpe.h"

namespace troupe::launcher {

struct ModelFlags {
  std::string weights;  // --weights: safetensors (troupe's, or Hugging Face GPT-2's)
  std::string load;     // --load: a checkpoint (save directory or DIR/iter_NNNNNNN)
  std::string model;    // --model: the preset a weights file without metadata is
  int tp = 1, pp = 1;
  int threads = 0;     // per shard; 0: the cores shared among the shards
  std::string device;  // --device cpu|cuda|opaque; empty: train's default (api::resolve_device)
  bool bf16 = false, fp16 = false;
  std::string attention_kernel;  // --attention-kernel; empty: train's default for the device
  std::string vocab_file, merge_file;
};

void add_model_flags(CLI::App* cmd, ModelFlags& f);

struct LoadedModel {
  api::RunDevice device;  // (declared first: it outlives lm, whose shards compute on it)
  std::unique_ptr<actors::ShardedModel> lm;
  std::unique_ptr<model::data::Gpt2Vocab> vocab;
  // "weights w.safetensors (L=4 ...), tp 2 x pp 1, bf16 on cpu, 1 thread per shard"
  // (and, where a GPU is visible and --device was not given, why this device)
  std::string description;
};

absl::StatusOr<LoadedModel> load_model(const ModelFlags& f);

}  // namespace troupe::launcher
