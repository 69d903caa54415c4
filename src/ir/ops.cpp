// The op table rows (from VLAC_IR_OPS) and shape/dtype inference per op.
// Inference only reads meta infos; it must never need tensor data.
#include "ir/ops.h"

#include <string>

#include "ir/graph.h"

namespace vlac::ir {
namespace {

constexpr OpInfo kOps[] = {
#define VLAC_IR_OP_ROW(kind, name, in_min, in_max, n_out) {name, in_min, in_max, n_out},
    VLAC_IR_OPS(VLAC_IR_OP_ROW)
#undef VLAC_IR_OP_ROW
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Status bad(OpKind op, const std::string& what) {
  return internal_error(std::string(op_name(op)) + ": " + what);
}

bool is_int_dtype(DType d) {
  return d == DType::I64 || d == DType::I32 || d == DType::I16 || d == DType::I8 ||
         d == DType::U64 || d == DType::U32 || d == DType::U16 || d == DType::U8;
}

// numpy broadcasting of two shapes.
Result<std::vector<int64_t>> broadcast(OpKind op, const std::vector<int64_t>& a,
                                       const std::vector<int64_t>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      return bad(op, "cannot broadcast " + shape_str(a) + " with " + shape_str(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t last(const ValueInfo& v) { return v.shape.empty() ? 1 : v.shape.back(); }

}  // namespace

const OpInfo& op_info(OpKind op) { return kOps[static_cast<size_t>(op)]; }
int op_count() { return static_cast<int>(sizeof(kOps) / sizeof(kOps[0])); }

Result<std::vector<ValueInfo>> infer_outputs(OpKind op, const std::vector<const ValueInfo*>& in,
                                             const Attrs& attrs) {
  const OpInfo& oi = op_info(op);
  int n = static_cast<int>(in.size());
  if (n < oi.n_in_min || (oi.n_in_max >= 0 && n > oi.n_in_max))
    return bad(op, "takes " + std::to_string(oi.n_in_min) + ".." +
                       (oi.n_in_max < 0 ? std::string("n") : std::to_string(oi.n_in_max)) +
                       " inputs, got " + std::to_string(n));
  auto rank_is = [&](int i, size_t r, const char* what) -> Status {
    if (in[static_cast<size_t>(i)]->shape.size() != r)
      return bad(op, std::string(what) + " must have rank " + std::to_string(r) + ", got " +
                         shape_str(in[static_cast<size_t>(i)]->shape));
    return Status::ok();
  };
  if (op == OpKind::Input || op == OpKind::Constant || op == OpKind::Weight)
    return bad(op, "has no inference; its info is given");
  const ValueInfo& x = *in[0];  // every other op has at least one input (table)
  switch (op) {
    case OpKind::Input:
    case OpKind::Constant:
    case OpKind::Weight:
      break;
    case OpKind::Linear: {
      const ValueInfo& w = *in[1];
      VLAC_RETURN_IF_ERROR(rank_is(1, 2, "weight"));
      if (x.shape.empty() || last(x) != w.shape[1])
        return bad(op, "x " + shape_str(x.shape) + " does not match weight " + shape_str(w.shape));
      if (n == 3 && (in[2]->shape.size() != 1 || in[2]->shape[0] != w.shape[0]))
        return bad(op, "bias " + shape_str(in[2]->shape) + " does not match weight " +
                           shape_str(w.shape));
      ValueInfo out{x.dtype, x.shape};
      out.shape.back() = w.shape[0];
      return std::vector<ValueInfo>{out};
    }
    case OpKind::MatMul: {
      const ValueInfo& b = *in[1];
      if (x.shape.size() < 2 || b.shape.size() != x.shape.size())
        return bad(op, "needs equal ranks >= 2, got " + shape_str(x.shape) + " and " +
                           shape_str(b.shape));
      size_t r = x.shape.size();
      for (size_t i = 0; i + 2 < r; ++i)
        if (x.shape[i] != b.shape[i]) return bad(op, "batch dims differ");
      if (x.shape[r - 1] != b.shape[r - 2])
        return bad(op, "inner dims differ: " + shape_str(x.shape) + " x " + shape_str(b.shape));
      ValueInfo out{x.dtype, x.shape};
      out.shape[r - 1] = b.shape[r - 1];
      return std::vector<ValueInfo>{out};
    }
    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::Mul:
    case OpKind::EulerStep: {
      if (x.dtype != in[1]->dtype)
        return bad(op, std::string("dtypes differ: ") + dtype_name(x.dtype) + " and " +
                           dtype_name(in[1]->dtype));
      if (op == OpKind::EulerStep && x.shape != in[1]->shape)
        return bad(op, "x and v shapes differ");
      VLAC_ASSIGN_OR_RETURN(auto s, broadcast(op, x.shape, in[1]->shape));
      return std::vector<ValueInfo>{{x.dtype, s}};
    }
    case OpKind::Scale:
    case OpKind::GeluTanh:
    case OpKind::SiLU:
    case OpKind::Softmax:
      return std::vector<ValueInfo>{x};
    case OpKind::LayerNorm:
    case OpKind::RMSNorm: {
      for (int i = 1; i < n; ++i)
        if (in[static_cast<size_t>(i)]->shape != std::vector<int64_t>{last(x)})
          return bad(op, "param " + shape_str(in[static_cast<size_t>(i)]->shape) +
                             " does not match x " + shape_str(x.shape));
      if (x.shape.empty()) return bad(op, "x must have rank >= 1");
      return std::vector<ValueInfo>{x};
    }
    case OpKind::AdaRMSNorm: {
      if (x.shape.empty()) return bad(op, "x must have rank >= 1");
      if (in[1]->numel() != 3 * last(x) || last(*in[1]) != 3 * last(x))
        return bad(op, "modulation " + shape_str(in[1]->shape) + " must hold 3 x " +
                           std::to_string(last(x)) + " values");
      return std::vector<ValueInfo>{x, {in[1]->dtype, {last(x)}}};
    }
    case OpKind::GeGLU:
      if (x.shape != in[1]->shape || x.dtype != in[1]->dtype)
        return bad(op, "gate and up differ: " + to_string(x) + " vs " + to_string(*in[1]));
      return std::vector<ValueInfo>{x};
    case OpKind::RoPE: {
      VLAC_RETURN_IF_ERROR(rank_is(0, 3, "x"));
      VLAC_RETURN_IF_ERROR(rank_is(1, 1, "positions"));
      if (in[1]->shape[0] != x.shape[0] || !is_int_dtype(in[1]->dtype))
        return bad(op, "positions " + to_string(*in[1]) + " must be int[" +
                           std::to_string(x.shape[0]) + "]");
      if (x.shape[2] % 2 != 0) return bad(op, "head dim must be even");
      return std::vector<ValueInfo>{x};
    }
    case OpKind::Attention: {
      VLAC_RETURN_IF_ERROR(rank_is(0, 3, "q"));
      VLAC_RETURN_IF_ERROR(rank_is(1, 3, "k"));
      VLAC_RETURN_IF_ERROR(rank_is(2, 3, "v"));
      const auto &q = x.shape, &k = in[1]->shape, &v = in[2]->shape;
      if (k[0] != v[0] || k[1] != v[1] || q[2] != k[2] || k[1] <= 0 || q[1] % k[1] != 0)
        return bad(op, "q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) +
                           " are inconsistent");
      if (n == 4 && in[3]->shape != std::vector<int64_t>{q[0], k[0]})
        return bad(op, "mask " + shape_str(in[3]->shape) + " must be [" + std::to_string(q[0]) +
                           ", " + std::to_string(k[0]) + "]");
      // kv_block B: block-diagonal attention over images batched along T (SigLIP of several
      // cameras): query t sees keys [t/B·B, t/B·B + B) only. No mask then, and T = S.
      if (const int64_t blk = attrs.get_int("kv_block", 0); blk != 0) {
        if (blk < 0 || n == 4 || q[0] != k[0] || q[0] % blk != 0)
          return bad(op, "kv_block " + std::to_string(blk) + " needs no mask and q " + shape_str(q) +
                             ", k " + shape_str(k) + " with as many rows, a multiple of it");
      }
      return std::vector<ValueInfo>{{x.dtype, {q[0], q[1], v[2]}}};
    }
    case OpKind::PatchEmbed: {
      // image [C,Y,X], or [N,C,Y,X]: N images, their patches one after another.
      if (x.shape.size() != 4) VLAC_RETURN_IF_ERROR(rank_is(0, 3, "image"));
      VLAC_RETURN_IF_ERROR(rank_is(1, 4, "weight"));
      const int64_t images = x.shape.size() == 4 ? x.shape[0] : 1;
      const std::vector<int64_t> img(x.shape.end() - 3, x.shape.end());
      const auto& w = in[1]->shape;
      if (images < 1) return bad(op, "no image in " + shape_str(x.shape));
      if (w[1] != img[0] || w[2] <= 0 || w[3] <= 0 || img[1] < w[2] || img[2] < w[3])
        return bad(op, "image " + shape_str(img) + " does not match weight " + shape_str(w));
      if (n == 3 && in[2]->shape != std::vector<int64_t>{w[0]})
        return bad(op, "bias must be [" + std::to_string(w[0]) + "]");
      return std::vector<ValueInfo>{{x.dtype, {images * (img[1] / w[2]) * (img[2] / w[3]), w[0]}}};
    }
    case OpKind::Embedding: {
      VLAC_RETURN_IF_ERROR(rank_is(0, 2, "table"));
      VLAC_RETURN_IF_ERROR(rank_is(1, 1, "ids"));
      if (!is_int_dtype(in[1]->dtype)) return bad(op, "ids must be an integer type");
      return std::vector<ValueInfo>{{x.dtype, {in[1]->shape[0], x.shape[1]}}};
    }
    case OpKind::Concat: {
      int64_t r = static_cast<int64_t>(x.shape.size());
      int64_t axis = attrs.get_int("axis", 0);
      if (axis < 0) axis += r;
      if (axis < 0 || axis >= r) return bad(op, "axis out of range");
      ValueInfo out = x;
      for (int i = 1; i < n; ++i) {
        const ValueInfo& y = *in[static_cast<size_t>(i)];
        bool ok = y.dtype == x.dtype && y.shape.size() == x.shape.size();
        for (int64_t d = 0; ok && d < r; ++d)
          ok = d == axis || y.shape[static_cast<size_t>(d)] == x.shape[static_cast<size_t>(d)];
        if (!ok) return bad(op, "input " + std::to_string(i) + " " + to_string(y) +
                                    " does not match " + to_string(x));
        out.shape[static_cast<size_t>(axis)] += y.shape[static_cast<size_t>(axis)];
      }
      return std::vector<ValueInfo>{out};
    }
    case OpKind::Slice: {
      int64_t r = static_cast<int64_t>(x.shape.size());
      int64_t axis = attrs.get_int("axis", 0);
      if (axis < 0) axis += r;
      if (axis < 0 || axis >= r) return bad(op, "axis out of range");
      int64_t dim = x.shape[static_cast<size_t>(axis)];
      int64_t start = attrs.get_int("start", 0), end = attrs.get_int("end", dim);
      if (start < 0 || end > dim || start > end)
        return bad(op, "range [" + std::to_string(start) + ", " + std::to_string(end) +
                           ") outside dim " + std::to_string(dim));
      ValueInfo out = x;
      out.shape[static_cast<size_t>(axis)] = end - start;
      return std::vector<ValueInfo>{out};
    }
    case OpKind::Reshape: {
      std::vector<int64_t> s = attrs.get_ints("shape");
      int64_t known = 1, n_free = 0;
      for (int64_t d : s) {
        if (d == -1) ++n_free;
        else if (d < 0) return bad(op, "negative dim in " + shape_str(s));
        else if (__builtin_mul_overflow(known, d, &known)) return bad(op, "shape " + shape_str(s) + " too large");
      }
      if (n_free > 1) return bad(op, "more than one -1 in " + shape_str(s));
      if (n_free == 1) {
        if (known == 0 || x.numel() % known != 0) return bad(op, "cannot infer -1");
        for (int64_t& d : s) if (d == -1) d = x.numel() / known;
        known = x.numel();
      }
      if (known != x.numel())
        return bad(op, "cannot reshape " + shape_str(x.shape) + " to " + shape_str(s));
      return std::vector<ValueInfo>{{x.dtype, s}};
    }
    case OpKind::Transpose: {
      std::vector<int64_t> perm = attrs.get_ints("perm");
      if (perm.size() != x.shape.size()) return bad(op, "perm rank differs from x");
      std::vector<bool> seen(perm.size());
      ValueInfo out = x;
      for (size_t i = 0; i < perm.size(); ++i) {
        int64_t p = perm[i];
        if (p < 0 || p >= static_cast<int64_t>(perm.size()) || seen[static_cast<size_t>(p)])
          return bad(op, "perm " + shape_str(perm) + " is not a permutation");
        seen[static_cast<size_t>(p)] = true;
        out.shape[i] = x.shape[static_cast<size_t>(p)];
      }
      return std::vector<ValueInfo>{out};
    }
    case OpKind::Cast: {
      auto dt = dtype_from_name(attrs.get_string("dtype"));
      if (!dt) return bad(op, "unknown dtype \"" + attrs.get_string("dtype") + "\"");
      return std::vector<ValueInfo>{{*dt, x.shape}};
    }
    case OpKind::TimeEmbedding: {
      int64_t dim = attrs.get_int("dim", 0);
      if (x.numel() != 1) return bad(op, "t must hold one value, got " + shape_str(x.shape));
      if (dim <= 0 || dim % 2 != 0) return bad(op, "dim must be positive and even");
      return std::vector<ValueInfo>{{DType::F32, {dim}}};
    }
  }
  return bad(op, "unknown op");
}

}  // namespace vlac::ir
