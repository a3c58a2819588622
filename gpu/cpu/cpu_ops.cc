// The CPU backend's op table: each op is enqueued on the stream's worker and
// calls the raw kernel of gpu/cpu/cpu_kernels.h. Lambdas capture tensors by
// value, so their storage lives until the op has run. Tensors in bf16/f16
// reach the fp32 kernels through cpu::Staging (widened, outputs rounded
// once), the elementwise kernels and bf16 GEMMs take them as they are.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu/cpu/cpu_convert.h"
#include "gpu/cpu/cpu_device.h"
#include "gpu/cpu/cpu_kernels.h"
#include "gpu/kernels.h"

namespace troupe::gpu {
namespace {

using i64 = std::int64_t;

float* f(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
const std::int32_t* i32(const Tensor& t) { return t.data<std::int32_t>(); }
std::int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }

// Calls fn(rows, i0, n) on the rows [i0, i0 + n) of x seen as (rows, cols):
// all at once in f32, blocks of 64 in bf16/f16 (what a row-wise op widens
// at a time). False as soon as fn is.
template <typename Fn>
bool for_row_blocks(const Tensor& x, Fn&& fn) {
  const i64 N = rows(x), cols = x.size(-1);
  const Tensor x2 = x.reshape({N, cols});
  if (x.dtype == DType::kF32) return fn(x2, 0, N);
  constexpr i64 kRows = 64;
  for (i64 i0 = 0; i0 < N; i0 += kRows) {
    const i64 n = i0 + kRows < N ? kRows : N - i0;
    if (!fn(x2.view(i0 * cols, {n, cols}), i0, n)) return false;
  }
  return true;
}

class CpuKernels final : public Kernels {
 public:
  void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, VocabSlice v) override {
    const std::int64_t total = v.whole() ? wte.size(0) : v.total;
    on(s).enqueue_op("embedding_forward", [&s, out, tokens, wte, wpe, v, total] {
      const bool ok =
          out.dtype == DType::kF32
              ? cpu::embedding_forward(f(out), i32(tokens), f(wte), f(wpe), out.size(0),
                                       out.size(1), out.size(2), wte.size(0), v.begin, total)
              : cpu::embedding_forward(out.raw(), out.dtype, i32(tokens), wte.raw(), wpe.raw(),
                                       out.size(0), out.size(1), out.size(2), wte.size(0), v.begin,
                                       total);
      if (!ok) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("embedding_forward: a token id is outside [0, ", total, ")")));
      }
    });
  }

  void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, VocabSlice v) override {
    const std::int64_t total = v.whole() ? dwte.size(0) : v.total;
    on(s).enqueue_op("embedding_backward", [&s, dwte, dwpe, dout, tokens, v, total] {
      cpu::Staging st;
      if (!cpu::embedding_backward(f(dwte), f(dwpe), st.in(dout), i32(tokens), dout.size(0),
                                   dout.size(1), dout.size(2), dwte.size(0), v.begin, total)) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("embedding_backward: a token id is outside [0, ", total, ")")));
      }
    });
  }

  void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& w, const Tensor& b) override {
    on(s).enqueue_op("layernorm_forward", [=] {
      cpu::Staging st;
      cpu::layernorm_forward(st.out(out), f(mean), f(rstd), st.in(inp), st.in(w), st.in(b),
                             rows(inp), inp.size(-1));
      st.commit();
    });
  }

  void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& inp, const Tensor& w,
                          const Tensor& mean, const Tensor& rstd) override {
    on(s).enqueue_op("layernorm_backward", [=] {
      cpu::Staging st;
      cpu::layernorm_backward(st.inout(dinp), f(dw), f(db), st.in(dout), st.in(inp), st.in(w),
                              f(mean), f(rstd), rows(inp), inp.size(-1));
      st.commit();
    });
  }

  void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                      const Tensor& bias) override {
    on(s).enqueue_op("matmul_forward", [=] {
      if (inp.dtype == DType::kBF16 && cpu::bf16_matmul_native()) {
        cpu::matmul_forward_bf16(out.raw(), inp.raw(), w.raw(),
                                 bias.defined() ? bias.raw() : nullptr, rows(inp), inp.size(-1),
                                 w.size(0));
        return;
      }
      cpu::Staging st;
      cpu::matmul_forward(st.out(out), st.in(inp), st.in(w), st.in(bias), rows(inp), inp.size(-1),
                          w.size(0));
      st.commit();
    });
  }

  void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& w,
                       Accumulate dinp_mode) override {
    on(s).enqueue_op("matmul_backward", [=] {
      const bool accumulate = dinp_mode == Accumulate::kYes;
      if (inp.dtype == DType::kBF16 && cpu::bf16_matmul_native()) {
        cpu::matmul_backward_bf16(dinp.raw(), f(dw), f(dbias), dout.raw(), inp.raw(), w.raw(),
                                  rows(inp), inp.size(-1), w.size(0), accumulate);
        return;
      }
      cpu::Staging st;
      cpu::matmul_backward(accumulate ? st.inout(dinp) : st.out(dinp), f(dw), f(dbias), st.in(dout),
                           st.in(inp), st.in(w), rows(inp), inp.size(-1), w.size(0), accumulate);
      st.commit();
    });
  }

  void matmul_backward_weight(Stream& s, const Tensor& dw, const Tensor& dout,
                              const Tensor& inp) override {
    on(s).enqueue_op("matmul_backward_weight", [=] {
      if (inp.dtype == DType::kBF16 && cpu::bf16_matmul_native()) {
        cpu::matmul_backward_weight_bf16(f(dw), dout.raw(), inp.raw(), rows(inp), inp.size(-1),
                                         dw.size(0));
        return;
      }
      cpu::Staging st;
      cpu::matmul_backward_weight(f(dw), st.in(dout), st.in(inp), rows(inp), inp.size(-1),
                                  dw.size(0));
    });
  }

  void bias_backward(Stream& s, const Tensor& dbias, const Tensor& dout) override {
    on(s).enqueue_op("bias_backward", [=] {
      cpu::bias_backward(f(dbias), dout.raw(), dout.dtype, rows(dout), dout.size(-1));
    });
  }

  void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp) override {
    on(s).enqueue_op("gelu_forward",
                     [=] { cpu::gelu_forward(out.raw(), inp.raw(), inp.dtype, inp.numel()); });
  }

  void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp,
                     const Tensor& dout) override {
    on(s).enqueue_op("gelu_backward", [=] {
      cpu::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), inp.dtype, inp.numel());
    });
  }

  void flash_attention_forward(Stream& s, const Tensor& out, const Tensor& lse,
                               const Tensor& qkv) override {
    on(s).enqueue_op("flash_attention_forward", [=] {
      cpu::Staging st;
      cpu::flash_attention_forward(st.out(out), st.out(lse), st.in(qkv), qkv.size(0), qkv.size(1),
                                   qkv.size(2) / 3, lse.size(1));
      st.commit();
    });
  }

  void flash_attention_backward(Stream& s, const Tensor& dqkv, const Tensor& delta,
                                const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse) override {
    on(s).enqueue_op("flash_attention_backward", [=] {
      cpu::Staging st;
      cpu::flash_attention_backward(st.out(dqkv), st.out(delta), st.in(dout), st.in(qkv),
                                    st.in(out), st.in(lse), qkv.size(0), qkv.size(1),
                                    qkv.size(2) / 3, lse.size(1));
      st.commit();
    });
  }

  void flash_attention_cached(Stream& s, const Tensor& out, const Tensor& kcache,
                              const Tensor& vcache, const Tensor& qkv, std::int64_t pos) override {
    on(s).enqueue_op("flash_attention_cached", [=] {
      cpu::Staging st;
      cpu::flash_attention_cached(st.out(out), st.inout(kcache), st.inout(vcache), st.in(qkv),
                                  qkv.size(0), qkv.size(1), qkv.size(2) / 3, kcache.size(1),
                                  kcache.size(2), pos);
      st.commit();
    });
  }

  void attention_forward(Stream& s, const Tensor& out, const Tensor& att,
                         const Tensor& qkv) override {
    on(s).enqueue_op("attention_forward", [=] {
      cpu::Staging st;
      cpu::attention_forward(st.out(out), st.out(att), st.in(qkv), qkv.size(0), qkv.size(1),
                             qkv.size(2) / 3, att.size(1));
      st.commit();
    });
  }

  void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                          const Tensor& qkv, const Tensor& att) override {
    on(s).enqueue_op("attention_backward", [=] {
      cpu::Staging st;
      cpu::attention_backward(st.out(dqkv), st.out(datt), st.in(dout), st.in(qkv), st.in(att),
                              qkv.size(0), qkv.size(1), qkv.size(2) / 3, att.size(1));
      st.commit();
    });
  }

  void attention_cached(Stream& s, const Tensor& out, const Tensor& att, const Tensor& kcache,
                        const Tensor& vcache, const Tensor& qkv, std::int64_t pos) override {
    on(s).enqueue_op("attention_cached", [=] {
      cpu::Staging st;
      cpu::attention_cached(st.out(out), st.out(att), st.inout(kcache), st.inout(vcache),
                            st.in(qkv), qkv.size(0), qkv.size(1), qkv.size(2) / 3, kcache.size(1),
                            kcache.size(2), pos);
      st.commit();
    });
  }

  void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) override {
    on(s).enqueue_op("residual_forward", [=] {
      cpu::residual_forward(out.raw(), a.raw(), b.raw(), a.dtype, a.numel());
    });
  }

  // (The cross-entropy ops widen bf16/f16 logits a block of rows at a
  // time: fp32 math, no fp32 copy of the whole logits.)
  void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse,
                            const Tensor& logits, const Tensor& targets, int V) override {
    on(s).enqueue_op("crossentropy_forward", [&s, losses, lse, logits, targets, V] {
      const bool ok = for_row_blocks(logits, [&](const Tensor& x, i64 i0, i64 n) {
        cpu::Staging st;
        return cpu::crossentropy_forward(f(losses) + i0, f(lse) + i0, st.in(x), i32(targets) + i0,
                                         n, V, x.size(-1));
      });
      if (!ok) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("crossentropy_forward: a target is outside [0, ", V, ")")));
      }
    });
  }

  void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                             const Tensor& lse, const Tensor& targets, float dloss, int V,
                             VocabSlice v) override {
    on(s).enqueue_op("crossentropy_backward", [&s, dlogits, logits, lse, targets, dloss, V, v] {
      const i64 Vp = logits.size(-1);
      const Tensor d2 = dlogits.reshape({rows(dlogits), Vp});
      const bool ok = for_row_blocks(logits, [&](const Tensor& x, i64 i0, i64 n) {
        cpu::Staging st;
        // (dlogits may alias logits: the kernel reads each row before it
        // writes it, so a widened block is its own output.)
        const Tensor d = d2.view(i0 * Vp, {n, Vp});
        const float* xf = st.in(x);
        const bool in_place = d.storage == x.storage && d.offset == x.offset;
        float* df = in_place && x.dtype != DType::kF32 ? const_cast<float*>(xf) : st.out(d);
        if (!cpu::crossentropy_backward(df, xf, f(lse) + i0, i32(targets) + i0, dloss, n, V, Vp,
                                        v.begin)) {
          return false;
        }
        if (df == xf && x.dtype != DType::kF32) cpu::narrow(d.raw(), d.dtype, df, d.numel());
        st.commit();
        return true;
      });
      if (!ok) {
        s.fail(absl::InvalidArgumentError(
            absl::StrCat("crossentropy_backward: a target is outside [0, ", V, ")")));
      }
    });
  }

  void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                            const Tensor& targets, int V, VocabSlice v) override {
    on(s).enqueue_op("crossentropy_partial", [&s, stats, logits, targets, V, v] {
      const bool ok = for_row_blocks(logits, [&](const Tensor& x, i64 i0, i64 n) {
        cpu::Staging st;
        return cpu::crossentropy_partial(f(stats) + 3 * i0, st.in(x), i32(targets) + i0, n, V,
                                         x.size(-1), v.begin);
      });
      if (!ok) {
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

  // The whole list as one task (the default enqueues one or two a
  // parameter: its update, and its copy where it has one), in the same
  // order: an optimizer step's queueing is one task, not dozens.
  void adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors, const AdamWArgs& a) override {
    on(s).enqueue_op("adamw", [tensors, a] {
      for (const AdamWTensor& t : tensors) {
        cpu::adamw(f(t.p), f(t.g), f(t.m), f(t.v), t.p.numel(), a.lr, a.beta1, a.beta2, a.eps,
                   t.weight_decay, a.step, a.grad_scale);
        if (t.compute.defined()) {
          cpu::convert(t.compute.raw(), t.compute.dtype, t.p.raw(), t.p.dtype, t.compute.numel());
        }
      }
    });
  }

  void fill(Stream& s, const Tensor& x, float value) override {
    on(s).enqueue_op("fill", [=] { cpu::fill(x.raw(), value, x.dtype, x.numel()); });
  }

  void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) override {
    on(s).enqueue_op("axpy", [=] { cpu::axpy(y.raw(), alpha, x.raw(), y.dtype, y.numel()); });
  }

  void convert(Stream& s, const Tensor& out, const Tensor& in) override {
    on(s).enqueue_op("convert",
                     [=] { cpu::convert(out.raw(), out.dtype, in.raw(), in.dtype, out.numel()); });
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
