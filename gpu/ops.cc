// Argument checks for every op, then dispatch to the stream's backend.
#include "gpu/ops.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace troupe::gpu::ops {
namespace {

// Collects the first failed precondition of one op call.
class Check {
 public:
  Check(Stream& s, absl::string_view op) : s_(s), op_(op) {}

  // `t` must be defined, contiguous, of `dtype` and `want` shape, on s's device.
  // (The messages are made only on an error: a check runs for every tensor
  // of every op enqueued, an optimizer step's hundreds included.)
  Check& tensor(absl::string_view name, const Tensor& t, DType dtype, const Shape& want) {
    if (!error_.empty()) return *this;
    auto want_s = [&] { return absl::StrCat(dtype_name(dtype), shape_string(want)); };
    if (!t.defined()) {
      error_ = absl::StrCat(label(name), " is undefined, want ", want_s());
    } else if (t.dtype != dtype || t.shape != want) {
      error_ = absl::StrCat(label(name), " is ", t.describe(), ", want ", want_s());
    } else if (!t.is_contiguous()) {
      error_ = absl::StrCat(label(name), " is not contiguous");
    } else if (t.device() != &s_.device()) {
      error_ = absl::StrCat(label(name), " is on ", t.device()->name(), ", the stream on ",
                            s_.device().name());
    } else if (t.storage->host) {
      error_ = absl::StrCat(label(name), " is host memory (ops::copy moves it to the device)");
    }
    return *this;
  }
  // copy's operands: defined, contiguous, inside their storage, of the
  // stream's device (its memory or host memory of it).
  Check& copyable(absl::string_view name, const Tensor& t) {
    if (!error_.empty()) return *this;
    if (!t.defined()) {
      error_ = absl::StrCat(label(name), " is undefined");
    } else if (!t.is_contiguous()) {
      error_ = absl::StrCat(label(name), " is not contiguous");
    } else if (t.device() != &s_.device()) {
      error_ = absl::StrCat(label(name), " is on ", t.device()->name(), ", the stream on ",
                            s_.device().name());
    } else if (static_cast<std::size_t>(t.offset) * dtype_size(t.dtype) + t.nbytes() >
               t.storage->bytes) {
      error_ = absl::StrCat(label(name), " ", t.describe(), " does not fit its storage");
    }
    return *this;
  }
  Check& f32(absl::string_view name, const Tensor& t, const Shape& want) {
    return tensor(name, t, DType::kF32, want);
  }
  // As tensor(), but an undefined tensor is allowed (an absent bias).
  Check& optional(absl::string_view name, const Tensor& t, DType dtype, const Shape& want) {
    return t.defined() ? tensor(name, t, dtype, want) : *this;
  }
  // `t`, which sets the op's compute dtype, must be defined and f32, bf16
  // or f16 (gpu/kernels.h: the dtypes of an op's tensors).
  Check& compute(absl::string_view name, const Tensor& t) {
    if (!error_.empty()) return *this;
    if (!t.defined()) {
      error_ = absl::StrCat(label(name), " is undefined");
    } else if (!is_compute_dtype(t.dtype)) {
      error_ = absl::StrCat(label(name), " is ", t.describe(), ", want f32, bf16 or f16");
    }
    return *this;
  }
  // `t` must have at least `rank` dimensions (for deriving sizes from it).
  Check& rank(absl::string_view name, const Tensor& t, int rank) {
    if (!error_.empty()) return *this;
    if (!t.defined() || t.dim() < rank) {
      error_ = absl::StrCat(label(name), " must have ", rank, " dimensions, is ",
                            t.defined() ? t.describe() : std::string("undefined"));
    } else if (t.size(-1) == 0) {
      error_ = absl::StrCat(label(name), " has an empty last dimension: ", t.describe());
    }
    return *this;
  }
  Check& that(bool condition, absl::string_view message) {
    if (error_.empty() && !condition) error_ = std::string(message);
    return *this;
  }

  // The checks after this one name tensor i of a list ("p" as "p[3]"); -1:
  // a tensor of its own again.
  Check& item(int i) {
    item_ = i;
    return *this;
  }

  // True when the op may be enqueued; otherwise the error is on the stream.
  bool ok() {
    if (!s_.status().ok()) return false;  // sticky: skip after an earlier error
    if (error_.empty()) return true;
    s_.fail(absl::InvalidArgumentError(absl::StrCat(op_, ": ", error_)));
    return false;
  }

 private:
  std::string label(absl::string_view name) const {
    return item_ < 0 ? std::string(name) : absl::StrCat(name, "[", item_, "]");
  }

  Stream& s_;
  absl::string_view op_;
  std::string error_;
  int item_ = -1;
};

// Rows of a [..., C] tensor, and their shape [...].
std::int64_t rows(const Tensor& t) { return t.numel() / t.size(-1); }
Shape row_shape(const Tensor& t) { return Shape(t.shape.begin(), t.shape.end() - 1); }

}  // namespace

// The slice must lie in its vocabulary.
bool slice_ok(const VocabSlice& v, std::int64_t rows) {
  return v.whole() || (v.begin >= 0 && v.total > 0 && v.begin < v.total && rows > 0);
}

void embedding_forward(Stream& s, const Tensor& out, const Tensor& tokens, const Tensor& wte,
                       const Tensor& wpe, VocabSlice slice) {
  Check c(s, "embedding_forward");
  if (!c.rank("out", out, 3).rank("wte", wte, 2).rank("wpe", wpe, 2).ok()) return;
  const std::int64_t B = out.size(0), T = out.size(1), C = out.size(2);
  const DType A = wte.dtype;
  c.compute("wte", wte)
      .tensor("out", out, A, {B, T, C})
      .tensor("tokens", tokens, DType::kI32, {B, T})
      .tensor("wte", wte, A, {wte.size(0), C})
      .tensor("wpe", wpe, A, {wpe.size(0), C})
      .that(T <= wpe.size(0), "sequence is longer than wpe")
      .that(slice_ok(slice, wte.size(0)), "vocabulary slice outside its vocabulary");
  if (c.ok()) s.device().kernels().embedding_forward(s, out, tokens, wte, wpe, slice);
}

void embedding_backward(Stream& s, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& tokens, VocabSlice slice) {
  Check c(s, "embedding_backward");
  if (!c.rank("dout", dout, 3).rank("dwte", dwte, 2).rank("dwpe", dwpe, 2).ok()) return;
  const std::int64_t B = dout.size(0), T = dout.size(1), C = dout.size(2);
  c.compute("dout", dout)
      .tensor("dout", dout, dout.dtype, {B, T, C})
      .tensor("tokens", tokens, DType::kI32, {B, T})
      .f32("dwte", dwte, {dwte.size(0), C})
      .f32("dwpe", dwpe, {dwpe.size(0), C})
      .that(T <= dwpe.size(0), "sequence is longer than dwpe")
      .that(slice_ok(slice, dwte.size(0)), "vocabulary slice outside its vocabulary");
  if (c.ok()) s.device().kernels().embedding_backward(s, dwte, dwpe, dout, tokens, slice);
}

void layernorm_forward(Stream& s, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& inp, const Tensor& w, const Tensor& b) {
  Check c(s, "layernorm_forward");
  if (!c.rank("inp", inp, 2).ok()) return;
  const std::int64_t C = inp.size(-1);
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("out", out, A, inp.shape)
      .f32("mean", mean, row_shape(inp))
      .f32("rstd", rstd, row_shape(inp))
      .tensor("w", w, A, {C})
      .tensor("b", b, A, {C});
  if (c.ok()) s.device().kernels().layernorm_forward(s, out, mean, rstd, inp, w, b);
}

void layernorm_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                        const Tensor& dout, const Tensor& inp, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd) {
  Check c(s, "layernorm_backward");
  if (!c.rank("inp", inp, 2).ok()) return;
  const std::int64_t C = inp.size(-1);
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("dinp", dinp, A, inp.shape)
      .tensor("dout", dout, A, inp.shape)
      .f32("dw", dw, {C})
      .f32("db", db, {C})
      .tensor("w", w, A, {C})
      .f32("mean", mean, row_shape(inp))
      .f32("rstd", rstd, row_shape(inp));
  if (c.ok()) s.device().kernels().layernorm_backward(s, dinp, dw, db, dout, inp, w, mean, rstd);
}

void residual_layernorm_forward(Stream& s, const Tensor& residual, const Tensor& out,
                                const Tensor& mean, const Tensor& rstd, const Tensor& a,
                                const Tensor& b, const Tensor& w, const Tensor& bias) {
  Check c(s, "residual_layernorm_forward");
  if (!c.rank("a", a, 2).ok()) return;
  const std::int64_t C = a.size(-1);
  const DType A = a.dtype;
  c.compute("a", a)
      .tensor("a", a, A, a.shape)
      .tensor("b", b, A, a.shape)
      .tensor("residual", residual, A, a.shape)
      .tensor("out", out, A, a.shape)
      .f32("mean", mean, row_shape(a))
      .f32("rstd", rstd, row_shape(a))
      .tensor("w", w, A, {C})
      .tensor("bias", bias, A, {C})
      .that(!(out.defined() && residual.defined() && out.raw() == residual.raw()),
            "out and residual are the same tensor (the residual is kept)");
  if (c.ok()) {
    s.device().kernels().residual_layernorm_forward(s, residual, out, mean, rstd, a, b, w, bias);
  }
}

void matmul_forward(Stream& s, const Tensor& out, const Tensor& inp, const Tensor& w,
                    const Tensor& bias) {
  Check c(s, "matmul_forward");
  if (!c.rank("inp", inp, 2).rank("w", w, 2).ok()) return;
  const std::int64_t IC = inp.size(-1), OC = w.size(0);
  Shape out_shape = inp.shape;
  out_shape.back() = OC;
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("w", w, A, {OC, IC})
      .tensor("out", out, A, out_shape)
      .optional("bias", bias, A, {OC});
  if (c.ok()) s.device().kernels().matmul_forward(s, out, inp, w, bias);
}

void matmul_backward(Stream& s, const Tensor& dinp, const Tensor& dw, const Tensor& dbias,
                     const Tensor& dout, const Tensor& inp, const Tensor& w, Accumulate dinp_mode) {
  Check c(s, "matmul_backward");
  if (!c.rank("inp", inp, 2).rank("w", w, 2).ok()) return;
  const std::int64_t IC = inp.size(-1), OC = w.size(0);
  Shape out_shape = inp.shape;
  out_shape.back() = OC;
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("w", w, A, {OC, IC})
      .tensor("dout", dout, A, out_shape)
      .tensor("dinp", dinp, A, inp.shape)
      .optional("dw", dw, DType::kF32, {OC, IC})
      .optional("dbias", dbias, DType::kF32, {OC});
  if (c.ok()) s.device().kernels().matmul_backward(s, dinp, dw, dbias, dout, inp, w, dinp_mode);
}

void matmul_backward_weight(Stream& s, const Tensor& dw, const Tensor& dout, const Tensor& inp) {
  Check c(s, "matmul_backward_weight");
  if (!c.rank("inp", inp, 2).rank("dw", dw, 2).ok()) return;
  const std::int64_t IC = inp.size(-1), OC = dw.size(0);
  Shape out_shape = inp.shape;
  out_shape.back() = OC;
  c.compute("inp", inp).tensor("dout", dout, inp.dtype, out_shape).f32("dw", dw, {OC, IC});
  if (c.ok()) s.device().kernels().matmul_backward_weight(s, dw, dout, inp);
}

void bias_backward(Stream& s, const Tensor& dbias, const Tensor& dout) {
  Check c(s, "bias_backward");
  if (!c.rank("dout", dout, 2).ok()) return;
  c.compute("dout", dout).f32("dbias", dbias, {dout.size(-1)});
  if (c.ok()) s.device().kernels().bias_backward(s, dbias, dout);
}

void matmul_gelu_forward(Stream& s, const Tensor& out, const Tensor& pre, const Tensor& inp,
                         const Tensor& w, const Tensor& bias) {
  Check c(s, "matmul_gelu_forward");
  if (!c.rank("inp", inp, 2).rank("w", w, 2).ok()) return;
  const std::int64_t IC = inp.size(-1), OC = w.size(0);
  Shape out_shape = inp.shape;
  out_shape.back() = OC;
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("w", w, A, {OC, IC})
      .tensor("out", out, A, out_shape)
      .tensor("pre", pre, A, out_shape)
      .optional("bias", bias, A, {OC})
      .that(!(out.defined() && pre.defined() && out.raw() == pre.raw()),
            "out and pre are the same tensor (pre is kept)");
  if (c.ok()) s.device().kernels().matmul_gelu_forward(s, out, pre, inp, w, bias);
}

void matmul_backward_gelu(Stream& s, const Tensor& dpre, const Tensor& dpre_bias, const Tensor& dw,
                          const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& w, const Tensor& pre) {
  Check c(s, "matmul_backward_gelu");
  if (!c.rank("inp", inp, 2).rank("w", w, 2).ok()) return;
  const std::int64_t IC = inp.size(-1), OC = w.size(0);
  Shape out_shape = inp.shape;
  out_shape.back() = OC;
  const DType A = inp.dtype;
  c.compute("inp", inp)
      .tensor("inp", inp, A, inp.shape)
      .tensor("pre", pre, A, inp.shape)
      .tensor("w", w, A, {OC, IC})
      .tensor("dout", dout, A, out_shape)
      .tensor("dpre", dpre, A, inp.shape)
      .optional("dpre_bias", dpre_bias, DType::kF32, {IC})
      .optional("dw", dw, DType::kF32, {OC, IC})
      .optional("dbias", dbias, DType::kF32, {OC});
  for (const auto& [name, t] : {std::pair{"inp", &inp}, std::pair{"pre", &pre},
                                std::pair{"dout", &dout}, std::pair{"w", &w}, std::pair{"dw", &dw},
                                std::pair{"dbias", &dbias}, std::pair{"dpre_bias", &dpre_bias}}) {
    if (dpre.defined() && t->defined() && dpre.raw() == t->raw()) {
      c.that(false, absl::StrCat("dpre and ", name, " are the same tensor"));
    }
  }
  if (c.ok()) {
    s.device().kernels().matmul_backward_gelu(s, dpre, dpre_bias, dw, dbias, dout, inp, w, pre);
  }
}

void gelu_forward(Stream& s, const Tensor& out, const Tensor& inp) {
  Check c(s, "gelu_forward");
  c.compute("inp", inp).tensor("out", out, inp.dtype, inp.shape);
  if (c.ok()) s.device().kernels().gelu_forward(s, out, inp);
}

void gelu_backward(Stream& s, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  Check c(s, "gelu_backward");
  c.compute("inp", inp)
      .tensor("inp", inp, inp.dtype, inp.shape)
      .tensor("dinp", dinp, inp.dtype, inp.shape)
      .tensor("dout", dout, inp.dtype, inp.shape);
  if (c.ok()) s.device().kernels().gelu_backward(s, dinp, inp, dout);
}

namespace {

// Attention's heads: qkv's last dimension 3C, C a multiple of NH.
bool heads_ok(Check& c, std::int64_t C3, std::int64_t NH) {
  return c.that(C3 % 3 == 0, "qkv's last dimension is not 3*C")
      .that(NH > 0 && (C3 / 3) % NH == 0, "C is not a multiple of the head count")
      .ok();
}

// A KV-cached step's qkv (B, n, 3C) and caches (B, NH, Tc, HS), positions
// pos..pos+n-1 inside them.
bool cache_ok(Check& c, const Tensor& qkv, const Tensor& kcache, const Tensor& vcache,
              std::int64_t pos) {
  const std::int64_t B = qkv.size(0), n = qkv.size(1), C3 = qkv.size(2);
  const std::int64_t NH = kcache.size(1), Tc = kcache.size(2), HS = kcache.size(3);
  c.that(C3 == 3 * NH * HS, "qkv's last dimension is not 3 * NH * HS of the cache")
      .that(pos >= 0 && pos + n <= Tc, "positions pos..pos+n-1 are outside the cache");
  if (!c.ok()) return false;
  const DType A = qkv.dtype;
  return c.compute("qkv", qkv)
      .tensor("qkv", qkv, A, qkv.shape)
      .tensor("kcache", kcache, A, {B, NH, Tc, HS})
      .tensor("vcache", vcache, A, {B, NH, Tc, HS})
      .ok();
}

}  // namespace

void flash_attention_forward(Stream& s, const Tensor& out, const Tensor& lse, const Tensor& qkv) {
  Check c(s, "flash_attention_forward");
  if (!c.rank("qkv", qkv, 3).rank("lse", lse, 3).ok()) return;
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), NH = lse.size(1);
  if (!heads_ok(c, C3, NH)) return;
  const DType A = qkv.dtype;
  c.compute("qkv", qkv)
      .tensor("qkv", qkv, A, qkv.shape)
      .tensor("lse", lse, DType::kF32, {B, NH, T})
      .tensor("out", out, A, {B, T, C3 / 3});
  if (c.ok()) s.device().kernels().flash_attention_forward(s, out, lse, qkv);
}

void flash_attention_backward(Stream& s, const Tensor& dqkv, const Tensor& delta,
                              const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse) {
  Check c(s, "flash_attention_backward");
  if (!c.rank("qkv", qkv, 3).rank("lse", lse, 3).ok()) return;
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), NH = lse.size(1);
  if (!heads_ok(c, C3, NH)) return;
  const DType A = qkv.dtype;
  c.compute("qkv", qkv)
      .tensor("qkv", qkv, A, qkv.shape)
      .tensor("dqkv", dqkv, A, qkv.shape)
      .tensor("out", out, A, {B, T, C3 / 3})
      .tensor("dout", dout, A, {B, T, C3 / 3})
      .tensor("lse", lse, DType::kF32, {B, NH, T})
      .tensor("delta", delta, DType::kF32, {B, NH, T});
  if (c.ok()) s.device().kernels().flash_attention_backward(s, dqkv, delta, dout, qkv, out, lse);
}

void flash_attention_cached(Stream& s, const Tensor& out, const Tensor& kcache,
                            const Tensor& vcache, const Tensor& qkv, std::int64_t pos) {
  Check c(s, "flash_attention_cached");
  if (!c.rank("qkv", qkv, 3).rank("kcache", kcache, 4).ok()) return;
  if (!cache_ok(c, qkv, kcache, vcache, pos)) return;
  c.tensor("out", out, qkv.dtype, {qkv.size(0), qkv.size(1), qkv.size(2) / 3});
  if (c.ok()) s.device().kernels().flash_attention_cached(s, out, kcache, vcache, qkv, pos);
}

void attention_forward(Stream& s, const Tensor& out, const Tensor& att, const Tensor& qkv) {
  Check c(s, "attention_forward");
  if (!c.rank("qkv", qkv, 3).rank("att", att, 4).ok()) return;
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), NH = att.size(1);
  if (!heads_ok(c, C3, NH)) return;
  const DType A = qkv.dtype;
  c.compute("qkv", qkv)
      .tensor("qkv", qkv, A, qkv.shape)
      .tensor("att", att, A, {B, NH, T, T})
      .tensor("out", out, A, {B, T, C3 / 3});
  if (c.ok()) s.device().kernels().attention_forward(s, out, att, qkv);
}

void attention_backward(Stream& s, const Tensor& dqkv, const Tensor& datt, const Tensor& dout,
                        const Tensor& qkv, const Tensor& att) {
  Check c(s, "attention_backward");
  if (!c.rank("qkv", qkv, 3).rank("att", att, 4).ok()) return;
  const std::int64_t B = qkv.size(0), T = qkv.size(1), C3 = qkv.size(2), NH = att.size(1);
  if (!heads_ok(c, C3, NH)) return;
  const DType A = qkv.dtype;
  c.compute("qkv", qkv)
      .tensor("qkv", qkv, A, qkv.shape)
      .tensor("dqkv", dqkv, A, qkv.shape)
      .tensor("att", att, A, {B, NH, T, T})
      .tensor("datt", datt, A, {B, NH, T, T})
      .tensor("dout", dout, A, {B, T, C3 / 3});
  if (c.ok()) s.device().kernels().attention_backward(s, dqkv, datt, dout, qkv, att);
}

void attention_cached(Stream& s, const Tensor& out, const Tensor& att, const Tensor& kcache,
                      const Tensor& vcache, const Tensor& qkv, std::int64_t pos) {
  Check c(s, "attention_cached");
  if (!c.rank("qkv", qkv, 3).rank("kcache", kcache, 4).ok()) return;
  const std::int64_t B = qkv.size(0), n = qkv.size(1), C3 = qkv.size(2);
  const std::int64_t NH = kcache.size(1), Tc = kcache.size(2);
  if (!cache_ok(c, qkv, kcache, vcache, pos)) return;
  const DType A = qkv.dtype;
  c.tensor("att", att, A, {B, NH, n, Tc}).tensor("out", out, A, {B, n, C3 / 3});
  if (c.ok()) s.device().kernels().attention_cached(s, out, att, kcache, vcache, qkv, pos);
}

void residual_forward(Stream& s, const Tensor& out, const Tensor& a, const Tensor& b) {
  Check c(s, "residual_forward");
  c.compute("a", a)
      .tensor("a", a, a.dtype, a.shape)
      .tensor("b", b, a.dtype, a.shape)
      .tensor("out", out, a.dtype, a.shape);
  if (c.ok()) s.device().kernels().residual_forward(s, out, a, b);
}

void crossentropy_forward(Stream& s, const Tensor& losses, const Tensor& lse, const Tensor& logits,
                          const Tensor& targets, int V) {
  Check c(s, "crossentropy_forward");
  if (!c.rank("logits", logits, 2).ok()) return;
  const std::int64_t N = rows(logits), Vp = logits.size(-1);
  c.compute("logits", logits)
      .tensor("logits", logits, logits.dtype, logits.shape)
      .f32("losses", losses, {N})
      .f32("lse", lse, {N})
      .tensor("targets", targets, DType::kI32, {N})
      .that(V > 0 && V <= Vp, "V must be in [1, Vp]");
  if (c.ok()) s.device().kernels().crossentropy_forward(s, losses, lse, logits, targets, V);
}

void crossentropy_backward(Stream& s, const Tensor& dlogits, const Tensor& logits,
                           const Tensor& lse, const Tensor& targets, float dloss, int V,
                           VocabSlice slice) {
  Check c(s, "crossentropy_backward");
  if (!c.rank("logits", logits, 2).ok()) return;
  const std::int64_t N = rows(logits), Vp = logits.size(-1);
  c.compute("logits", logits)
      .tensor("logits", logits, logits.dtype, logits.shape)
      .tensor("dlogits", dlogits, logits.dtype, logits.shape)
      .f32("lse", lse, {N})
      .tensor("targets", targets, DType::kI32, {N})
      .that(slice_ok(slice, Vp), "vocabulary slice outside its vocabulary")
      .that(V > 0 && (slice.whole() ? V <= Vp : V <= slice.total), "V must be in [1, Vp]");
  if (c.ok()) {
    s.device().kernels().crossentropy_backward(s, dlogits, logits, lse, targets, dloss, V, slice);
  }
}

void crossentropy_partial(Stream& s, const Tensor& stats, const Tensor& logits,
                          const Tensor& targets, int V, VocabSlice slice) {
  Check c(s, "crossentropy_partial");
  if (!c.rank("logits", logits, 2).ok()) return;
  const std::int64_t N = rows(logits), Vl = logits.size(-1);
  c.compute("logits", logits)
      .tensor("logits", logits, logits.dtype, logits.shape)
      .f32("stats", stats, {N, 3})
      .tensor("targets", targets, DType::kI32, {N})
      .that(slice_ok(slice, Vl), "vocabulary slice outside its vocabulary")
      .that(V > 0 && (slice.whole() ? V <= Vl : V <= slice.total), "V must be in [1, Vp]");
  if (c.ok()) s.device().kernels().crossentropy_partial(s, stats, logits, targets, V, slice);
}

void crossentropy_combine(Stream& s, const Tensor& losses, const Tensor& lse, const Tensor& stats) {
  Check c(s, "crossentropy_combine");
  if (!c.rank("stats", stats, 3).ok()) return;
  const std::int64_t N = stats.size(1);
  c.f32("stats", stats, {stats.size(0), N, 3}).f32("losses", losses, {N}).f32("lse", lse, {N});
  if (c.ok()) s.device().kernels().crossentropy_combine(s, losses, lse, stats);
}

void squared_norm(Stream& s, const Tensor& out, const Tensor& x) {
  Check c(s, "squared_norm");
  c.tensor("out", out, DType::kF64, {1}).f32("x", x, x.shape);
  if (c.ok()) s.device().kernels().squared_norm(s, out, x);
}

void adamw(Stream& s, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
           const AdamWArgs& args) {
  Check c(s, "adamw");
  c.f32("p", p, p.shape)
      .f32("g", g, p.shape)
      .f32("m", m, p.shape)
      .f32("v", v, p.shape)
      .that(args.step >= 1, "step must be >= 1");
  if (c.ok()) s.device().kernels().adamw(s, p, g, m, v, args);
}

void adamw_many(Stream& s, const std::vector<AdamWTensor>& tensors, const AdamWArgs& args) {
  Check c(s, "adamw_many");
  // The compute copies (where given) share one compute dtype: the first's.
  DType copies = DType::kF32;
  for (const AdamWTensor& t : tensors) {
    if (t.compute.defined()) {
      copies = t.compute.dtype;
      break;
    }
  }
  for (std::size_t i = 0; i < tensors.size(); i++) {
    const AdamWTensor& t = tensors[i];
    c.item(static_cast<int>(i))
        .f32("p", t.p, t.p.shape)
        .f32("g", t.g, t.p.shape)
        .f32("m", t.m, t.p.shape)
        .f32("v", t.v, t.p.shape);
    if (t.compute.defined()) {
      c.compute("compute", t.compute).tensor("compute", t.compute, copies, t.p.shape);
    }
  }
  c.item(-1).that(args.step >= 1, "step must be >= 1");
  if (c.ok() && !tensors.empty()) s.device().kernels().adamw_many(s, tensors, args);
}

void fill(Stream& s, const Tensor& x, float value) {
  Check c(s, "fill");
  c.compute("x", x).tensor("x", x, x.dtype, x.shape);
  if (c.ok()) s.device().kernels().fill(s, x, value);
}

void axpy(Stream& s, const Tensor& y, float alpha, const Tensor& x) {
  Check c(s, "axpy");
  c.compute("y", y).tensor("y", y, y.dtype, y.shape).tensor("x", x, y.dtype, y.shape);
  if (c.ok()) s.device().kernels().axpy(s, y, alpha, x);
}

void convert(Stream& s, const Tensor& out, const Tensor& in) {
  Check c(s, "convert");
  c.compute("out", out)
      .compute("in", in)
      .tensor("out", out, out.dtype, out.shape)
      .tensor("in", in, in.dtype, out.shape);
  if (c.ok() && out.storage == in.storage && out.dtype != in.dtype) {
    const std::size_t a = static_cast<std::size_t>(out.offset) * dtype_size(out.dtype);
    const std::size_t b = static_cast<std::size_t>(in.offset) * dtype_size(in.dtype);
    c.that(a + out.nbytes() <= b || b + in.nbytes() <= a, "out and in overlap");
  }
  if (c.ok()) s.device().kernels().convert(s, out, in);
}

void copy(Stream& s, const Tensor& dst, const Tensor& src) {
  Check c(s, "copy");
  c.copyable("dst", dst).copyable("src", src);
  if (c.ok() && (dst.dtype != src.dtype || dst.numel() != src.numel())) {
    c.that(false, absl::StrCat("dst is ", dst.describe(), ", src ", src.describe(),
                               ": want the same dtype and element count"));
  }
  if (c.ok() && dst.storage == src.storage) {
    const std::int64_t a = dst.offset, b = src.offset, n = dst.numel();
    c.that(a == b || a + n <= b || b + n <= a, "dst and src overlap");
  }
  if (c.ok() && dst.nbytes() > 0) s.device().kernels().copy(s, dst, src);
}

}  // namespace troupe::gpu::ops
