// The CUDA backend's op table: each op passes its tensors' device pointers to
// its launcher (gpu/cuda/<op>.cu) through CudaStream::run_op, which names it
// in an NVTX range, checks the launch, and holds the tensors until it has run.
// Tensors in the op's compute dtype go as raw pointers with the dtype's
// Precision (the op's first input sets it: gpu/kernels.h), f32-only ones as
// float*.
#include "absl/strings/str_cat.h"
#include "gpu/cuda/cuda_launch.h"
#include "gpu/cuda/cuda_matmul.h"
#include "gpu/cuda/cuda_stream.h"
#include "gpu/kernels.h"

namespace troupe::gpu::cuda {
namespace {

float* f(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }
void* raw(const Tensor& t) { return t.defined() ? t.raw() : nullptr; }
Precision prec(const Tensor& t) { return dtype_precision(t.dtype); }
const std::int32_t* i32(const Tensor& t) { return t.data<std::int32_t>(); }
i64 rows(const Tensor& t) { return t.numel() / t.size(-1); }
std::size_t column_scratch_bytes(i64 N, i64 C) {
  return static_cast<std::size_t>(column_chunks(N) * C) * sizeof(float);
}

absl::Status launched(cudaError_t err) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("kernel launch: ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

class CudaKernels final : public Kernels {
 public:
  void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe, VocabSlice v) override {
    const i64 total = v.whole() ? wte.size(0) : v.total;
    on(s).run_op("embedding_forward", {&out, &tokens, &wte, &wpe}, [&](const Launch& at) {
      return launched(cuda::embedding_forward(at, prec(wte), raw(out), i32(tokens), raw(wte),
                                              raw(wpe), out.size(0), out.size(1), out.size(2),
                                              wte.size(0), v.begin, total));
    });
  }

  void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens, VocabSlice v) override {
    const i64 total = v.whole() ? dwte.size(0) : v.total;
    on(s).run_op("embedding_backward", {&dwte, &dwpe, &dout, &tokens}, [&](const Launch& at) {
      return launched(cuda::embedding_backward(at, prec(dout), f(dwte), f(dwpe), raw(dout),
                                               i32(tokens), dout.size(0), dout.size(1),
                                               dout.size(2), dwte.size(0), v.begin, total));
    });
  }

  void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                         const Tensor& inp, const Tensor& w, const Tensor& b) override {
    on(s).run_op("layernorm_forward", {&out, &mean, &rstd, &inp, &w, &b}, [&](const Launch& at) {
      return launched(cuda::layernorm_forward(at, prec(inp), raw(out), f(mean), f(rstd), raw(inp),
                                              raw(w), raw(b), rows(inp), inp.size(-1)));
    });
  }

  void residual_layernorm_forward(Stream& s, const Tensor& residual, const Tensor& out,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                  const Tensor& b, const Tensor& w, const Tensor& bias) override {
    on(s).run_op("residual_layernorm_forward", {&residual, &out, &mean, &rstd, &a, &b, &w, &bias},
                 [&](const Launch& at) {
                   return launched(cuda::residual_layernorm_forward(
                       at, prec(a), raw(residual), raw(out), f(mean), f(rstd), raw(a), raw(b),
                       raw(w), raw(bias), rows(a), a.size(-1)));
                 });
  }

  void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                          const Tensor& dout, const Tensor& inp, const Tensor& w,
                          const Tensor& mean, const Tensor& rstd) override {
    CudaStream& cs = on(s);
    const Tensor scratch = cs.scratch(column_scratch_bytes(rows(inp), inp.size(-1)));
    cs.run_op("layernorm_backward", {&dinp, &dw, &db, &dout, &inp, &w, &mean, &rstd, &scratch},
              [&](const Launch& at) {
                return launched(cuda::layernorm_backward(
                    at, prec(inp), raw(dinp), f(dw), f(db), raw(dout), raw(inp), raw(w), f(mean),
                    f(rstd), rows(inp), inp.size(-1), scratch.data<float>()));
              });
  }

  void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                      const Tensor& bias) override {
    CudaStream& cs = on(s);
    cs.run_op("matmul_forward", {&out, &inp, &w, &bias}, [&](const Launch& at) -> absl::Status {
      absl::StatusOr<Gemm> g = cs.gemm();
      if (!g.ok()) return g.status();
      return cuda::matmul_forward(at, *g, prec(inp), raw(out), raw(inp), raw(w), raw(bias),
                                  rows(inp), inp.size(-1), w.size(0));
    });
  }

  void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& w,
                       Accumulate dinp_mode) override {
    CudaStream& cs = on(s);
    const Tensor scratch =
        dbias.defined() ? cs.scratch(column_scratch_bytes(rows(inp), w.size(0))) : Tensor{};
    cs.run_op("matmul_backward", {&dinp, &dw, &dbias, &dout, &inp, &w, &scratch},
              [&](const Launch& at) -> absl::Status {
                absl::StatusOr<Gemm> g = cs.gemm();
                if (!g.ok()) return g.status();
                return cuda::matmul_backward(at, *g, prec(inp), raw(dinp), f(dw), f(dbias),
                                             raw(dout), raw(inp), raw(w), rows(inp), inp.size(-1),
                                             w.size(0), dinp_mode == Accumulate::kYes, f(scratch));
              });
  }

  void matmul_backward_weight(Stream& s, const Tensor& dw, const Tensor& dout,
                              const Tensor& inp) override {
    CudaStream& cs = on(s);
    cs.run_op("matmul_backward_weight", {&dw, &dout, &inp}, [&](const Launch& at) -> absl::Status {
      absl::StatusOr<Gemm> g = cs.gemm();
      if (!g.ok()) return g.status();
      return cuda::matmul_backward_weight(at, *g, prec(inp), f(dw), raw(dout), raw(inp), rows(inp),
                                          inp.size(-1), dw.size(0));
    });
  }

  void bias_backward(Stream& s, const Tensor& dbias, const Tensor& dout) override {
    CudaStream& cs = on(s);
    const Tensor scratch = cs.scratch(column_scratch_bytes(rows(dout), dout.size(-1)));
    cs.run_op("bias_backward", {&dbias, &dout, &scratch}, [&](const Launch& at) {
      return launched(cuda::bias_grad(at, prec(dout), f(dbias), raw(dout), rows(dout),
                                      dout.size(-1), scratch.data<float>()));
    });
  }

  void matmul_gelu_forward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                           const Tensor& w, const Tensor& bias) override {
    CudaStream& cs = on(s);
    cs.run_op("matmul_gelu_forward", {&out, &pre, &inp, &w, &bias},
              [&](const Launch& at) -> absl::Status {
                absl::StatusOr<Gemm> g = cs.gemm();
                if (!g.ok()) return g.status();
                return cuda::matmul_gelu_forward(at, *g, prec(inp), raw(out), raw(pre), raw(inp),
                                                 raw(w), raw(bias), rows(inp), inp.size(-1),
                                                 w.size(0));
              });
  }

  void matmul_backward_gelu(Stream& s, const Tensor& dpre, const Tensor& dpre_bias,
                            const Tensor& dw, const Tensor& dbias, const Tensor& dout,
                            const Tensor& inp, const Tensor& w, const Tensor& pre) override {
    CudaStream& cs = on(s);
    const i64 N = rows(inp), IC = inp.size(-1), OC = w.size(0);
    const Tensor scratch = cs.scratch(column_scratch_bytes(N, IC > OC ? IC : OC));
    cs.run_op("matmul_backward_gelu",
              {&dpre, &dpre_bias, &dw, &dbias, &dout, &inp, &w, &pre, &scratch},
              [&](const Launch& at) -> absl::Status {
                absl::StatusOr<Gemm> g = cs.gemm();
                if (!g.ok()) return g.status();
                return cuda::matmul_backward_gelu(at, *g, prec(inp), raw(dpre), f(dpre_bias), f(dw),
                                                  f(dbias), raw(dout), raw(inp), raw(w), raw(pre),
                                                  N, IC, OC, f(scratch));
              });
  }

  void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp) override {
    on(s).run_op("gelu_forward", {&out, &inp}, [&](const Launch& at) {
      return launched(cuda::gelu_forward(at, prec(inp), raw(out), raw(inp), inp.numel()));
    });
  }

  void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp,
                     const Tensor& dout) override {
    on(s).run_op("gelu_backward", {&dinp, &inp, &dout}, [&](const Launch& at) {
      return launched(
          cuda::gelu_backward(at, prec(inp), raw(dinp), raw(inp), raw(dout), inp.numel()));
    });
  }

  // The flash kernels' warps hold at most 256 of a head's dimensions.
  static bool flash_head_fits(Stream& s, const char* op, std::int64_t HS) {
    if (HS <= 256) return true;
    s.fail(absl::InvalidArgumentError(
        absl::StrCat(op, ": head size ", HS,
                     " is over the CUDA flash kernel's 256 (--attention-kernel "
                     "reference has no such limit)")));
    return false;
  }

  void flash_attention_forward(Stream& s, const Tensor& out, const Tensor& lse,
                               const Tensor& qkv) override {
    const std::int64_t C = qkv.size(2) / 3, NH = lse.size(1);
    if (!flash_head_fits(s, "flash_attention_forward", C / NH)) return;
    on(s).run_op("flash_attention_forward", {&out, &lse, &qkv}, [&](const Launch& at) {
      return launched(cuda::flash_attention_forward(at, prec(qkv), raw(out),
                                                    static_cast<float*>(raw(lse)), raw(qkv),
                                                    qkv.size(0), qkv.size(1), C, NH));
    });
  }

  void flash_attention_backward(Stream& s, const Tensor& dqkv, const Tensor& delta,
                                const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse) override {
    const std::int64_t C = qkv.size(2) / 3, NH = lse.size(1);
    if (!flash_head_fits(s, "flash_attention_backward", C / NH)) return;
    on(s).run_op(
        "flash_attention_backward", {&dqkv, &delta, &dout, &qkv, &out, &lse},
        [&](const Launch& at) {
          return launched(cuda::flash_attention_backward(
              at, prec(qkv), raw(dqkv), static_cast<float*>(raw(delta)), raw(dout), raw(qkv),
              raw(out), static_cast<const float*>(raw(lse)), qkv.size(0), qkv.size(1), C, NH));
        });
  }

  void flash_attention_cached(Stream& s, const Tensor& out, const Tensor& kcache,
                              const Tensor& vcache, const Tensor& qkv, std::int64_t pos) override {
    if (!flash_head_fits(s, "flash_attention_cached", kcache.size(3))) return;
    on(s).run_op("flash_attention_cached", {&out, &kcache, &vcache, &qkv}, [&](const Launch& at) {
      return launched(cuda::flash_attention_cached(
          at, prec(qkv), raw(out), raw(kcache), raw(vcache), raw(qkv), qkv.size(0), qkv.size(1),
          qkv.size(2) / 3, kcache.size(1), kcache.size(2), pos));
    });
  }

  void attention_forward(Stream& s, const Tensor& out, const Tensor& att,
                         const Tensor& qkv) override {
    on(s).run_op("attention_forward", {&out, &att, &qkv}, [&](const Launch& at) {
      return launched(cuda::attention_forward(at, prec(qkv), raw(out), raw(att), raw(qkv),
                                              qkv.size(0), qkv.size(1), qkv.size(2) / 3,
                                              att.size(1)));
    });
  }

  void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                          const Tensor& qkv, const Tensor& att) override {
    on(s).run_op("attention_backward", {&dqkv, &datt, &dout, &qkv, &att}, [&](const Launch& at) {
      return launched(cuda::attention_backward(at, prec(qkv), raw(dqkv), raw(datt), raw(dout),
                                               raw(qkv), raw(att), qkv.size(0), qkv.size(1),
                                               qkv.size(2) / 3, att.size(1)));
    });
  }

  void attention_cached(Stream& s, const Tensor& out, const Tensor& att, const Tensor& kcache,
                        const Tensor& vcache, const Tensor& qkv, std::int64_t pos) override {
    on(s).run_op("attention_cached", {&out, &att, &kcache, &vcache, &qkv}, [&](const Launch& at) {
      return launched(cuda::attention_cached(at, prec(qkv), raw(out), raw(att), raw(kcache),
                                             raw(vcache), raw(qkv), qkv.size(0), qkv.size(1),
                                             qkv.size(2) / 3, kcache.size(1), kcache.size(2), pos));
    });
  }

  void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) override {
    on(s).run_op("residual_forward", {&out, &a, &b}, [&](const Launch& at) {
      return launched(cuda::residual_forward(at, prec(a), raw(out), raw(a), raw(b), a.numel()));
    });
  }

  void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse,
                            const Tensor& logits, const Tensor& targets, int V) override {
    on(s).run_op("crossentropy_forward", {&losses, &lse, &logits, &targets}, [&](const Launch& at) {
      return launched(cuda::crossentropy_forward(at, prec(logits), f(losses), f(lse), raw(logits),
                                                 i32(targets), rows(logits), V, logits.size(-1)));
    });
  }

  void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                             const Tensor& lse, const Tensor& targets, float dloss, int V,
                             VocabSlice v) override {
    on(s).run_op(
        "crossentropy_backward", {&dlogits, &logits, &lse, &targets}, [&](const Launch& at) {
          return launched(cuda::crossentropy_backward(at, prec(logits), raw(dlogits), raw(logits),
                                                      f(lse), i32(targets), dloss, rows(logits), V,
                                                      logits.size(-1), v.begin));
        });
  }

  void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                            const Tensor& targets, int V, VocabSlice v) override {
    on(s).run_op("crossentropy_partial", {&stats, &logits, &targets}, [&](const Launch& at) {
      return launched(cuda::crossentropy_partial(at, prec(logits), f(stats), raw(logits),
                                                 i32(targets), rows(logits), V, logits.size(-1),
                                                 v.begin));
    });
  }

  void crossentropy_combine(Stream& s, const Tensor& losses, const Tensor& lse,
                            const Tensor& stats) override {
    on(s).run_op("crossentropy_combine", {&losses, &lse, &stats}, [&](const Launch& at) {
      return launched(cuda::crossentropy_combine(at, f(losses), f(lse), f(stats), stats.size(0),
                                                 stats.size(1)));
    });
  }

  void squared_norm(Stream& s, const Tensor& out, const Tensor& x) override {
    CudaStream& cs = on(s);
    const Tensor partial =
        cs.scratch(static_cast<std::size_t>(squared_norm_partials(x.numel())) * sizeof(double));
    cs.run_op("squared_norm", {&out, &x, &partial}, [&](const Launch& at) {
      return launched(
          cuda::squared_norm(at, out.data<double>(), f(x), x.numel(), partial.data<double>()));
    });
  }

  void adamw(Stream& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
             const AdamWArgs& a) override {
    on(s).run_op("adamw", {&p, &g, &m, &v}, [&](const Launch& at) {
      return launched(cuda::adamw(at, f(p), f(g), f(m), f(v), p.numel(), a.lr, a.beta1, a.beta2,
                                  a.eps, a.weight_decay, a.step, a.grad_scale));
    });
  }

  void adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors, const AdamWArgs& a) override {
    std::vector<AdamWPiece> pieces;
    pieces.reserve(tensors.size());
    CudaStream& cs = on(s);
    Precision compute = Precision::kFp32;  // the copies' (gpu/ops.cc: one dtype)
    for (const AdamWTensor& t : tensors) {
      pieces.push_back(
          {f(t.p), f(t.g), f(t.m), f(t.v), t.p.numel(), t.weight_decay, raw(t.compute)});
      if (t.compute.defined()) compute = prec(t.compute);
    }
    std::vector<const Tensor*> held;  // every tensor's storages, held until the op has run
    held.reserve(5 * tensors.size());
    for (const AdamWTensor& t : tensors) {
      for (const Tensor* x : {&t.p, &t.g, &t.m, &t.v, &t.compute}) held.push_back(x);
    }
    cs.run_op("adamw_many", held, [&](const Launch& at) {
      return launched(cuda::adamw_many(at, pieces.data(), static_cast<int>(pieces.size()), compute,
                                       a.lr, a.beta1, a.beta2, a.eps, a.step, a.grad_scale));
    });
  }

  void fill(Stream& s, const Tensor& x, float value) override {
    on(s).run_op("fill", {&x}, [&](const Launch& at) {
      return launched(cuda::fill(at, prec(x), raw(x), value, x.numel()));
    });
  }

  void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) override {
    on(s).run_op("axpy", {&y, &x}, [&](const Launch& at) {
      return launched(cuda::axpy(at, prec(y), raw(y), alpha, raw(x), y.numel()));
    });
  }

  // Tensors of one dtype that overlap without being the same elements (a
  // memmove, ops.cc allows it) go through the stream's scratch.
  void convert(Stream& s, const Tensor& out, const Tensor& in) override {
    CudaStream& cs = on(s);
    const bool apart = out.storage != in.storage || out.dtype != in.dtype ||
                       out.offset == in.offset || out.offset + out.numel() <= in.offset ||
                       in.offset + in.numel() <= out.offset;
    const Tensor scratch = apart ? Tensor{} : cs.scratch(in.nbytes());
    cs.run_op("convert", {&out, &in, &scratch}, [&](const Launch& at) {
      const i64 n = out.numel();
      if (apart) {
        return launched(cuda::convert(at, out.raw(), prec(out), in.raw(), prec(in), n));
      }
      const cudaError_t err = cuda::convert(at, scratch.raw(), prec(in), in.raw(), prec(in), n);
      if (err != cudaSuccess) return launched(err);
      return launched(cuda::convert(at, out.raw(), prec(out), scratch.raw(), prec(in), n));
    });
  }

  // Host memory is pinned (Device::allocate_host), so the copy is
  // asynchronous; cudaMemcpyDefault tells the direction from the pointers.
  void copy(Stream& s, const Tensor& dst, const Tensor& src) override {
    on(s).run_op("copy", {&dst, &src}, [&](const Launch& at) {
      return cuda_status(
          cudaMemcpyAsync(dst.raw(), src.raw(), dst.nbytes(), cudaMemcpyDefault, at.stream),
          "cudaMemcpyAsync");
    });
  }

 private:
  static CudaStream& on(Stream& s) { return static_cast<CudaStream&>(s); }
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels() { return std::make_unique<CudaKernels>(); }

}  // namespace troupe::gpu::cuda
