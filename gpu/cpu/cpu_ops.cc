// The CPU backend's op table: each op is enqueued on the stream's worker and
// calls the raw kernel of gpu/cpu/cpu_kernels.h. Lambdas capture tensors by
// value, so their storage lives until the op has run.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/kernels.h"

namespace troupe::gpu {
namespace {

float* f(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
const std::int32_t* i32(const Tensor& t) { return t.data<std::int32_t>(); }
std::int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

class CpuKernels final : public Kernels {
 public:
  void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, VocabSlice v) override {
    const std::int64_t total = v.whole() ? wte.size(0) : v.total;
    on(s).enqueue_op("embedding_forward", [&s, out, tokens, wte, wpe, v, total] {
      if (!cpu::embedding_forward(f(out), i32(tokens), f(wte), f(wpe), out.size(0), out.size(1),
                                  out.size(2), wte.size(0), v.begin, total)) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("embedding_forward: a token id is outside [0, ", total, ")")));
      }
    });
  }

  void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, VocabSlice v) override {
    const std::int64_t total = v.whole() ? dwte.size(0) : v.total;
    on(s).enqueue_op("embedding_backward", [&s, dwte, dwpe, dout, tokens, v, total] {
      if (!cpu::embedding_backward(f(dwte), f(dwpe), f(dout), i32(tokens), dout.size(0),
                                   dout.size(1), dout.size(2), dwte.size(0), v.begin, total)) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("embedding_backward: a token id is outside [0, ", total, ")")));
      }
    });
  }

  void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& w, const Tensor& b) override {
    on(s).enqueue_op("layernorm_forward", [=] {
      cpu::layernorm_forward(f(out), f(mean), f(rstd), f(inp), f(w), f(b), rows(inp), inp.size(-1));
    });
  }

  void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& inp, const Tensor& w,
                          const Tensor& mean, const Tensor& rstd) override {
    on(s).enqueue_op("layernorm_backward", [=] {
      cpu::layernorm_backward(f(dinp), f(dw), f(db), f(dout), f(inp), f(w), f(mean), f(rstd),
                              rows(inp), inp.size(-1));
    });
  }

  void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                      const Tensor& bias) override {
    on(s).enqueue_op("matmul_forward", [=] {
      cpu::matmul_forward(f(out), f(inp), f(w), f(bias), rows(inp), inp.size(-1), w.size(0));
    });
  }

  void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& w,
                       Accumulate dinp_mode) override {
    on(s).enqueue_op("matmul_backward", [=] {
      cpu::matmul_backward(f(dinp), f(dw), f(dbias), f(dout), f(inp), f(w), rows(inp), inp.size(-1),
                           w.size(0), dinp_mode == Accumulate::kYes);
    });
  }

  void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp) override {
    on(s).enqueue_op("gelu_forward", [=] { cpu::gelu_forward(f(out), f(inp), inp.numel()); });
  }

  void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp,
                     const Tensor& dout) override {
    on(s).enqueue_op("gelu_backward",
                     [=] { cpu::gelu_backward(f(dinp), f(inp), f(dout), inp.numel()); });
  }

  void attention_forward(Stream& s, const Tensor& out, const Tensor& att,
                         const Tensor& qkv) override {
    on(s).enqueue_op("attention_forward", [=] {
      cpu::attention_forward(f(out), f(att), f(qkv), qkv.size(0), qkv.size(1), qkv.size(2) / 3,
                             att.size(1));
    });
  }

  void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                          const Tensor& qkv, const Tensor& att) override {
    on(s).enqueue_op("attention_backward", [=] {
      cpu::attention_backward(f(dqkv), f(datt), f(dout), f(qkv), f(att), qkv.size(0), qkv.size(1),
                              qkv.size(2) / 3, att.size(1));
    });
  }

  void attention_cached(Stream& s, const Tensor& out, const Tensor& att, const Tensor& kcache,
                        const Tensor& vcache, const Tensor& qkv, std::int64_t pos) override {
    on(s).enqueue_op("attention_cached", [=] {
      cpu::attention_cached(f(out), f(att), f(kcache), f(vcache), f(qkv), qkv.size(0), qkv.size(1),
                            qkv.size(2) / 3, kcache.size(1), kcache.size(2), pos);
    });
  }

  void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) override {
    on(s).enqueue_op("residual_forward",
                     [=] { cpu::residual_forward(f(out), f(a), f(b), a.numel()); });
  }

  void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse,
                            const Tensor& logits, const Tensor& targets, int V) override {
    on(s).enqueue_op("crossentropy_forward", [&s, losses, lse, logits, targets, V] {
      if (!cpu::crossentropy_forward(f(losses), f(lse), f(logits), i32(targets), rows(logits), V,
                                     logits.size(-1))) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("crossentropy_forward: a target is outside [0, ", V, ")")));
      }
    });
  }

  void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                             const Tensor& lse, const Tensor& targets, float dloss, int V,
                             VocabSlice v) override {
    on(s).enqueue_op("crossentropy_backward", [&s, dlogits, logits, lse, targets, dloss, V, v] {
      if (!cpu::crossentropy_backward(f(dlogits), f(logits), f(lse), i32(targets), dloss,
                                      rows(logits), V, logits.size(-1), v.begin)) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("crossentropy_backward: a target is outside [0, ", V, ")")));
      }
    });
  }

  void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                            const Tensor& targets, int V, VocabSlice v) override {
    on(s).enqueue_op("crossentropy_partial", [&s, stats, logits, targets, V, v] {
      if (!cpu::crossentropy_partial(f(stats), f(logits), i32(targets), rows(logits), V,
                                     logits.size(-1), v.begin)) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("crossentropy_partial: a target is outside [0, ", V, ")")));
      }
    });
  }

  void crossentropy_combine(Stream& s, const Tensor& losses, const Tensor& lse,
                            const Tensor& stats) override {
    on(s).enqueue_op("crossentropy_combine", [=] {
      cpu::crossentropy_combine(f(losses), f(lse), f(stats), stats.size(0), stats.size(1));
    });
  }

  void squared_norm(Stream& s, const Tensor& out, const Tensor& x) override {
    on(s).enqueue_op("squared_norm",
                     [=] { *out.data<double>() = cpu::squared_norm(f(x), x.numel()); });
  }

  void adamw(Stream& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
             const AdamWArgs& a) override {
    on(s).enqueue_op("adamw", [=] {
      cpu::adamw(f(p), f(g), f(m), f(v), p.numel(), a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                 a.step, a.grad_scale);
    });
  }

  void fill(Stream& s, const Tensor& x, float value) override {
    on(s).enqueue_op("fill", [=] { cpu::fill(f(x), value, x.numel()); });
  }

  void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) override {
    on(s).enqueue_op("axpy", [=] { cpu::axpy(f(y), alpha, f(x), y.numel()); });
  }

  void round_to(Stream& s, const Tensor& out, const Tensor& in, Precision p) override {
    on(s).enqueue_op("round_to", [=] { cpu::round_to(f(out), f(in), out.numel(), p); });
  }

  void copy(Stream& s, const Tensor& dst, const Tensor& src) override {
    on(s).enqueue_op("copy", [=] { std::memcpy(dst.raw(), src.raw(), dst.nbytes()); });
  }

 private:
  static CpuStream& on(Stream& s) { return static_cast<CpuStream&>(s); }
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels() { return std::make_unique<CpuKernels>(); }

}  // namespace troupe::gpu
