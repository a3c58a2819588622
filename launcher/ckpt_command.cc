// `troupe ckpt`: checkpoint tools (model/checkpoint.h's format).
//   info DIR [--iter N]                       what it holds; every checksum and
//                                             every parameter's coverage checked
//   export DIR [--iter N] --to m.safetensors  the model, Hugging Face GPT-2 names
//   convert DIR [--iter N] --to DIR2 --tp T --pp P --dp D [--schedule S
//           --virtual-stages V]               resharded offline, as --load does
// DIR is a save directory (its tracker's checkpoint, or --iter N's) or a
// checkpoint directory DIR/iter_NNNNNNN. Any damage is an error naming the
// file and the tensor, and a non-zero exit; nothing is written then.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "actors/rank/rank.h"
#include "launcher/ckpt_convert.h"
#include "launcher/commands.h"
#include "model/checkpoint.h"
#include "model/gpt.h"
#include "model/weights.h"

namespace troupe::launcher {
namespace {
namespace ckpt = model::ckpt;
namespace fs = std::filesystem;

struct CkptFlags {
  std::string dir;
  std::optional<int> iter;
  std::string to;
  int tp = 1, pp = 1, dp = 1, virtual_stages = 1;
  std::string schedule = "1f1b";
};

int fail(const char* sub, const absl::Status& st) {
  std::fprintf(stderr, "troupe ckpt %s: error: %s\n", sub, std::string(st.message()).c_str());
  return 1;
}

absl::StatusOr<ckpt::Checkpoint> open_checkpoint(const CkptFlags& f) {
  if (!f.iter.has_value()) return ckpt::Checkpoint::open(f.dir);
  if (*f.iter < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--iter ", *f.iter, ": must be >= 0"));
  }
  return ckpt::Checkpoint::open(absl::StrCat(f.dir, "/", ckpt::iter_name(*f.iter)));
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Every (kind, parameter) the manifest lists, in its order, and the ranks
// whose files hold a piece of it.
struct TensorSummary {
  std::string param;
  std::vector<std::int64_t> global_shape;
  std::map<ckpt::Kind, std::set<std::string>> files;  // kind -> rank files
};

std::vector<TensorSummary> summarize(const ckpt::Checkpoint& c) {
  std::vector<TensorSummary> out;
  std::map<std::string, std::size_t> index;
  for (const ckpt::TensorRecord& r : c.records()) {
    auto [it, fresh] = index.emplace(r.param, out.size());
    if (fresh) out.push_back({.param = r.param, .global_shape = r.global_shape, .files = {}});
    out[it->second].files[r.kind].insert(r.file);
  }
  return out;
}

// "0-3" or "0,2": the ranks of rank_NNNNN.safetensors names (another name
// as it is: the manifest is input).
std::string rank_list(const std::set<std::string>& files) {
  std::vector<int> ranks;
  std::vector<std::string> others;
  for (const std::string& f : files) {
    int r = -1;
    if (absl::StartsWith(f, "rank_") && absl::SimpleAtoi(f.substr(5, 5), &r) &&
        f == ckpt::rank_file_name(r)) {
      ranks.push_back(r);
    } else {
      others.push_back(f);
    }
  }
  bool consecutive = true;
  for (std::size_t i = 1; i < ranks.size(); i++) consecutive &= ranks[i] == ranks[i - 1] + 1;
  std::string out = consecutive && ranks.size() > 2 ? absl::StrCat(ranks.front(), "-", ranks.back())
                                                    : absl::StrJoin(ranks, ",");
  if (!others.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", absl::StrJoin(others, ","));
  return out;
}

void print_header(const ckpt::Checkpoint& c) {
  const ckpt::Meta& m = c.meta();
  std::printf("checkpoint %s\n", c.dir().c_str());
  std::printf("  step %d, consumed samples %lld, evaluations %d\n", m.step,
              static_cast<long long>(m.consumed_samples), m.evaluations_done);
  std::printf("  layout %s (%d rank files)\n", m.describe_layout().c_str(), m.world());
  std::printf("  writer %s\n", m.writer.c_str());
  std::printf("  model %s\n", m.options.model.describe().c_str());
  std::printf("  global batch %d, micro-batch %d, seed %llu\n", m.options.global_batch,
              m.options.micro_batch, static_cast<unsigned long long>(m.options.seed));
}

void print_tensors(const ckpt::Checkpoint& c) {
  std::printf("  tensors (global shape; the ranks holding pieces, by kind):\n");
  for (const TensorSummary& t : summarize(c)) {
    std::string kinds;
    for (const auto& [kind, files] : t.files) {
      absl::StrAppend(&kinds, "  ", ckpt::kind_name(kind), " ", rank_list(files));
    }
    std::printf("    %-28s %-12s%s\n", t.param.c_str(), absl::StrJoin(t.global_shape, "x").c_str(),
                kinds.c_str());
  }
  std::map<ckpt::Kind, std::int64_t> bytes;
  for (const ckpt::TensorRecord& r : c.records()) bytes[r.kind] += (r.end - r.begin) * 4;
  std::printf("  sizes:");
  for (const auto& [kind, n] : bytes) std::printf(" %s %.2f MiB;", ckpt::kind_name(kind), mib(n));
  std::printf("\n  rank files:\n");
  std::int64_t total = 0;
  for (int r = 0; r < c.meta().world(); r++) {
    const std::string path = absl::StrCat(c.dir(), "/", ckpt::rank_file_name(r));
    std::error_code ec;
    const std::int64_t n = static_cast<std::int64_t>(fs::file_size(path, ec));
    total += ec ? 0 : n;
    std::printf("    %s %lld bytes\n", ckpt::rank_file_name(r).c_str(),
                ec ? -1LL : static_cast<long long>(n));
  }
  std::printf("  total %.2f MiB in %d files\n", mib(total), c.meta().world());
}

// No tensor of a parameter the manifest's model lacks (a manifest of another
// model than its files': export and convert would drop those silently).
absl::Status check_names(const ckpt::Checkpoint& c, const model::ParamLayout& whole) {
  for (const ckpt::TensorRecord& r : c.records()) {
    if (whole.find_or_null(r.param) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          c.dir(), "/", r.file, ": tensor ", r.name,
          " is not a parameter of the manifest's model (", c.meta().options.model.describe(), ")"));
    }
  }
  return absl::OkStatus();
}

// The tensors are the manifest's model's: every parameter of it, of every
// kind the checkpoint holds, with its global shape and every element in
// some rank's file (global_tensor() assembles each and names what is
// missing), and no tensor of another parameter.
absl::Status check_tensors(const ckpt::Checkpoint& c, int* tensors) {
  const model::GptConfig& config = c.meta().options.model;
  const model::ParamLayout whole = model::ParamLayout::gpt(config);
  const std::string which = absl::StrCat("the manifest's model (", config.describe(), ")");
  if (absl::Status st = check_names(c, whole); !st.ok()) return st;
  std::set<std::pair<ckpt::Kind, std::string>> present;
  for (const ckpt::TensorRecord& r : c.records()) present.emplace(r.kind, r.param);
  *tensors = 0;
  for (const ckpt::Kind kind :
       {ckpt::Kind::kParam, ckpt::Kind::kMaster, ckpt::Kind::kAdamM, ckpt::Kind::kAdamV}) {
    if (!c.has(kind)) continue;
    for (const model::ParamSpec& spec : whole.specs()) {
      if (present.count({kind, spec.name}) == 0) {
        return absl::FailedPreconditionError(absl::StrCat(c.dir(), ": ", which, " has ", spec.name,
                                                          " but no rank file holds its ",
                                                          ckpt::kind_name(kind)));
      }
      std::vector<std::int64_t> shape;
      absl::StatusOr<std::vector<float>> g = c.global_tensor(kind, spec.name, &shape);
      if (!g.ok()) return g.status();
      if (!std::equal(shape.begin(), shape.end(), spec.full_shape.begin(), spec.full_shape.end())) {
        return absl::FailedPreconditionError(absl::StrCat(
            c.dir(), ": ", ckpt::kind_name(kind), "/", spec.name, " is ", absl::StrJoin(shape, "x"),
            " but ", which, " has it ", absl::StrJoin(spec.full_shape, "x")));
      }
      ++*tensors;
    }
  }
  return absl::OkStatus();
}

int run_info(const CkptFlags& f) {
  absl::StatusOr<ckpt::Checkpoint> c = open_checkpoint(f);
  if (!c.ok()) return fail("info", c.status());
  print_header(*c);
  print_tensors(*c);
  std::fflush(stdout);
  if (absl::Status st = c->verify(); !st.ok()) return fail("info", st);
  int tensors = 0;
  if (absl::Status st = check_tensors(*c, &tensors); !st.ok()) return fail("info", st);
  std::printf("  verified: %zu pieces' CRC-32s; every element of %d global tensors present\n",
              c->records().size(), tensors);
  return 0;
}

// The parameters (not the master copy): what the model computes with and
// what --no-load-optim loads, so an export run with --init-weights is that
// fine-tune bitwise. (In fp32 training they equal the master copy anyway.)
int run_export(const CkptFlags& f) {
  absl::StatusOr<ckpt::Checkpoint> c = open_checkpoint(f);
  if (!c.ok()) return fail("export", c.status());
  model::Gpt whole(c->meta().options.model, 1, gpu::cpu_device());
  if (absl::Status st = check_names(*c, whole.layout()); !st.ok()) return fail("export", st);
  const ckpt::Piece all = {.kind = ckpt::Kind::kParam,
                           .layout = &whole.layout(),
                           .begin = 0,
                           .end = whole.layout().total(),
                           .data = whole.params().data<float>()};
  if (absl::Status st = c->fill(all); !st.ok()) return fail("export", st);
  if (absl::Status st = model::save_weights(whole, f.to); !st.ok()) {
    return fail("export", absl::Status(st.code(), absl::StrCat("--to ", st.message())));
  }
  std::printf("exported %s (step %d, %s) to %s\n", c->dir().c_str(), c->meta().step,
              c->meta().options.model.describe().c_str(), f.to.c_str());
  return 0;
}

int run_convert(const CkptFlags& f) {
  absl::StatusOr<ckpt::Checkpoint> c = open_checkpoint(f);
  if (!c.ok()) return fail("convert", c.status());
  if (absl::Status st = check_names(*c, model::ParamLayout::gpt(c->meta().options.model));
      !st.ok()) {
    return fail("convert", st);
  }
  absl::StatusOr<actors::ScheduleKind> kind = actors::parse_schedule(f.schedule);
  if (!kind.ok()) return fail("convert", kind.status());
  actors::ParallelOptions par = {
      {.tp = f.tp, .pp = f.pp, .dp = f.dp, .virtual_stages = f.virtual_stages}, *kind};
  if (absl::Status st = actors::place_for_schedule(*kind, &par); !st.ok())
    return fail("convert", st);
  if (absl::Status st = convert_checkpoint(*c, f.to, par); !st.ok()) return fail("convert", st);
  std::printf("converted %s (%s) to %s/%s (tp=%d pp=%d dp=%d %s%s)\n", c->dir().c_str(),
              c->meta().describe_layout().c_str(), f.to.c_str(),
              ckpt::iter_name(c->meta().step).c_str(), par.tp, par.pp, par.dp,
              actors::schedule_name(par.schedule).c_str(),
              par.virtual_stages > 1 ? absl::StrCat(" v=", par.virtual_stages).c_str() : "");
  return 0;
}

void add_source(CLI::App* cmd, CkptFlags& f) {
  cmd->add_option("dir", f.dir, "Save directory (its newest checkpoint) or DIR/iter_NNNNNNN")
      ->required();
  cmd->add_option("--iter", f.iter, "The checkpoint of this iteration in the save directory");
}

}  // namespace

Command add_ckpt_command(CLI::App& app) {
  auto f = std::make_shared<CkptFlags>();
  CLI::App* cmd = app.add_subcommand("ckpt", "Checkpoint tools: info, export, convert");
  cmd->require_subcommand(1);
  CLI::App* info = cmd->add_subcommand("info", "Describe a checkpoint and verify every checksum");
  add_source(info, *f);
  CLI::App* exp = cmd->add_subcommand(
      "export", "Write a checkpoint's model as safetensors with Hugging Face GPT-2 names");
  add_source(exp, *f);
  exp->add_option("--to", f->to, "Output file (.safetensors)")->required();
  CLI::App* conv = cmd->add_subcommand("convert", "Reshard a checkpoint into another layout");
  add_source(conv, *f);
  conv->add_option("--to", f->to, "Save directory for the converted checkpoint")->required();
  conv->add_option("--tp", f->tp, "Tensor-parallel size of the new layout");
  conv->add_option("--pp", f->pp, "Pipeline stages of the new layout");
  conv->add_option("--dp", f->dp, "Data-parallel replicas of the new layout");
  conv->add_option("--schedule", f->schedule,
                   "Pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zbv, zb-auto");
  conv->add_option("--virtual-stages", f->virtual_stages,
                   "Model chunks per stage (interleaved; 2 puts zb-auto on zbv's V)");
  return [f, info, exp] {
    if (info->parsed()) return run_info(*f);
    if (exp->parsed()) return run_export(*f);
    return run_convert(*f);
  };
}

}  // namespace troupe::launcher
