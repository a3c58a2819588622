// --recipe: the recipes and how they apply.
#include "api/recipe.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/flag_rules.h"

namespace troupe::api {
namespace {

// MT-NLG 530B's optimizer and schedule: Smith et al. 2022, "Using DeepSpeed
// and Megatron to Train Megatron-Turing NLG 530B" (arXiv 2201.11990),
// section 3 (model and training), whose sentences each value quotes.
struct Recipe {
  // "The sequence length is 2048 and the global batch size is 1920."
  int seq_len = 2048;
  int global_batch = 1920;
  // "The learning rate is 5.0e-5."
  float lr = 5.0e-5f;
  // "We used one billion tokens for linear learning rate warmup."
  double warmup_tokens = 1e9;
  // "We used cosine decay for the learning rate targeting to reach 10% of
  // its value over 340 billion tokens."
  float min_lr_fraction = 0.1f;
  double decay_tokens = 340e9;
  // "Over the first 12 billion tokens, we started at a batch size of 32 and
  // gradually increased the batch size in increments of 32, until we reach
  // the final batch size of 1920."
  int rampup_start = 32, rampup_increment = 32;
  double rampup_tokens = 12e9;
  // "We used Adam optimizer with beta1 = 0.9, beta2 = 0.95, and epsilon =
  // 1e-8. We clipped the gradient norm at 1.0 and used a weight decay of 0.1."
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, clip = 1.0f, weight_decay = 0.1f;
  // "For weight initialization, we used a normal distribution with zero
  // mean and a standard deviation of 4.0e-3."
  double init_std = 4.0e-3;
  // The run: 270 billion tokens (the paper's training set; Microsoft and
  // NVIDIA's announcement of 2021-10-11: "a training dataset with 270
  // billion tokens"). The cosine decay's 340B is its target, not the run.
  double train_tokens = 270e9;
};

}  // namespace

absl::Status check_recipe(const std::string& name) {
  if (name.empty() || name == "mt-nlg") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--recipe ", name, ": unknown; known: mt-nlg"));
}

std::set<std::string> apply_recipe(const std::string& name, const TrainFlags& f,
                                   model::TrainOptions* o) {
  std::set<std::string> set;
  if (name != "mt-nlg") return set;
  const Recipe r;
  auto apply = [&](const char* flag, auto* field, auto value) {
    if (given(f, flag)) return;
    *field = value;
    set.insert(flag);
  };
  apply("--seq-length", &o->model.T, r.seq_len);
  apply("--global-batch-size", &o->global_batch, r.global_batch);
  apply("--init-method-std", &o->model.init_std, r.init_std);
  apply("--lr", &o->lr.lr, r.lr);
  // The peak rate may be a flag's: the floor stays 10% of it.
  apply("--min-lr", &o->lr.min_lr, r.min_lr_fraction * o->lr.lr);
  const double T = o->model.T;  // tokens a sample
  apply("--lr-warmup-samples", &o->lr.warmup_samples,
        static_cast<std::int64_t>(r.warmup_tokens / T));
  apply("--lr-decay-samples", &o->lr.decay_samples, static_cast<std::int64_t>(r.decay_tokens / T));
  if (!given(f, "--rampup-batch-size")) {
    o->rampup = {.start = r.rampup_start,
                 .increment = r.rampup_increment,
                 .samples = static_cast<std::int64_t>(r.rampup_tokens / T)};
    set.insert("--rampup-batch-size");
  }
  apply("--adam-beta1", &o->adam.beta1, r.beta1);
  apply("--adam-beta2", &o->adam.beta2, r.beta2);
  apply("--adam-eps", &o->adam.eps, r.eps);
  apply("--clip-grad", &o->clip_grad, r.clip);
  apply("--weight-decay", &o->adam.weight_decay, r.weight_decay);
  // The run's length: the paper's, unless --train-samples says.
  if (!given(f, "--train-samples") && !given(f, "--steps")) {
    o->train_samples = static_cast<std::int64_t>(r.train_tokens / T);
    set.insert("--train-samples");
  }
  return set;
}

absl::Status explain_recipe(const absl::Status& st, const std::string& recipe,
                            const std::set<std::string>& recipe_set) {
  if (st.ok()) return st;
  for (const std::string& flag : recipe_set) {
    if (absl::StartsWith(st.message(), flag)) {
      return absl::Status(st.code(), absl::StrCat(st.message(), " (", flag, " is --recipe ", recipe,
                                                  "'s; give it to change it)"));
    }
  }
  return st;
}

}  // namespace troupe::api
