// CPU graph executor: results against direct kernel calls, buffer reuse from liveness, reshape
// aliasing, external input binding, bf16 weights, and clear errors for what it cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/executor.h"
#include "backends/cpu/kernels.h"
#include "core/quant.h"
#include "exec/memo_plan.h"

using namespace vlac;
using namespace vlac::cpu;
using ir::Attrs;
using ir::OpKind;
using ir::ValueId;
using ir::ValueInfo;

namespace {

// An in-memory "weight file": tensors appended (64-byte aligned) with their references.
struct FakeFile {
  std::vector<uint8_t> bytes;
  std::vector<ir::WeightRef> refs;
  ir::WeightRef add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    ir::WeightRef r;
    r.name = name;
    r.offset = (bytes.size() + 63) / 64 * 64;
    r.dtype = DType::F32;
    r.shape = std::move(shape);
    r.bytes = v.size() * 4;
    bytes.resize(r.offset + r.bytes);
    std::memcpy(bytes.data() + r.offset, v.data(), r.bytes);
    refs.push_back(r);
    return r;
  }
  std::vector<WeightFile> files() const { return {WeightFile{bytes.data(), bytes.size(), "fake", nullptr}}; }
};

ValueId V(Result<ValueId> r) {
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : 0;
}

std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

}  // namespace

TEST(CpuExecutor, MlpChainMatchesKernelsAndReusesBuffers) {
  const int64_t T = 5, D = 16, F = 64;
  FakeFile file;
  auto w1 = randv(size_t(F * D), 1), b1 = randv(size_t(F), 2), w2 = randv(size_t(D * F), 3), nw = randv(size_t(D), 4);
  ir::Graph g;
  ValueId x = g.add_input("x", ValueInfo{DType::F32, {T, D}});
  ValueId h = x;
  // Four identical residual MLP blocks: the arena must reuse the dead blocks' buffers.
  ValueId vw1 = g.weight(file.add("w1", {F, D}, w1));
  ValueId vb1 = g.weight(file.add("b1", {F}, b1));
  ValueId vw2 = g.weight(file.add("w2", {D, F}, w2));
  ValueId vnw = g.weight(file.add("nw", {D}, nw));
  for (int i = 0; i < 4; ++i) {
    ValueId u = V(g.add(OpKind::RMSNorm, {h, vnw}, Attrs{{"eps", 1e-6}}));
    ValueId f = V(g.add(OpKind::Linear, {u, vw1, vb1}));
    f = V(g.add(OpKind::GeluTanh, {f}));
    f = V(g.add(OpKind::Linear, {f, vw2}));
    h = V(g.add(OpKind::Add, {h, f}));
  }
  ValueId r = V(g.add(OpKind::Reshape, {h}, Attrs{{"shape", std::vector<int64_t>{T * D}}}));
  g.mark_output(r);
  ASSERT_TRUE(ir::verify(g).is_ok());

  std::vector<DType> run(file.refs.size(), DType::F32);
  auto weights = CpuWeights::load(file.refs, run, file.files());
  ASSERT_TRUE(weights.is_ok()) << weights.status().message();
  EXPECT_EQ(weights->owned_bytes(), 0u);  // aligned fp32: used in place
  auto ex = Executor::create(g, *weights);
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  const auto xin = randv(size_t(T * D), 5);
  std::memcpy(ex->input_data(ex->input_index("x")), xin.data(), xin.size() * 4);
  ASSERT_TRUE(ex->run().is_ok());

  // Reference with the kernels directly (sgemm there, the planned matmul in the executor: equal up
  // to summation order).
  std::vector<float> ref = xin, u(size_t(T * D)), f(size_t(T * F)), y(size_t(T * D));
  for (int i = 0; i < 4; ++i) {
    rms_norm(ref.data(), nw.data(), u.data(), T, D, 1e-6f);
    linear_f32(u.data(), w1.data(), b1.data(), f.data(), T, D, F);
    gelu_tanh(f.data(), f.data(), T * F);
    linear_f32(f.data(), w2.data(), nullptr, y.data(), T, F, D);
    for (size_t k = 0; k < ref.size(); ++k) ref[k] += y[k];
  }
  const float* out = ex->data_f32(r);
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(out[k], ref[k], 1e-5f * (1.0f + std::abs(ref[k]))) << k;
  // 20 intermediate values of up to T·F floats each; live at once: a handful.
  const uint64_t all = 4 * (2 * T * D + 2 * T * F + T * D) * 4;
  EXPECT_LT(ex->arena_bytes(), all / 3);
  // Packed weights: the same math up to summation order, a copy of both matrices owned.
  ExecutorOptions packed;
  packed.pack_weights = true;
  auto exp = Executor::create(g, *weights, packed);
  ASSERT_TRUE(exp.is_ok()) << exp.status().message();
  EXPECT_GE(exp->packed_bytes(), uint64_t(2 * D * F * 4));
  EXPECT_EQ(ex->packed_bytes(), 0u);
  std::memcpy(exp->input_data(exp->input_index("x")), xin.data(), xin.size() * 4);
  ASSERT_TRUE(exp->run().is_ok());
  for (size_t k = 0; k < ref.size(); ++k)
    EXPECT_NEAR(exp->data_f32(r)[k], ref[k], 1e-5f * (1.0f + std::abs(ref[k]))) << k;
  // Running twice gives the same result (no state leaks between runs).
  std::vector<float> first(out, out + ref.size());
  ASSERT_TRUE(ex->run().is_ok());
  EXPECT_EQ(std::memcmp(first.data(), ex->data_f32(r), first.size() * 4), 0);
}

TEST(CpuExecutor, BindInputConcatAttentionAndBf16Weights) {
  const int64_t S0 = 7, T = 3, H = 2, Dh = 8, D = 12;
  FakeFile file;
  auto wq = randv(size_t(H * Dh * D), 11), wk = randv(size_t(Dh * D), 12);
  ir::Graph g;
  ValueId x = g.add_input("x", ValueInfo{DType::F32, {T, D}});
  ValueId cache = g.add_input("cache", ValueInfo{DType::F32, {S0, 1, Dh}});
  ValueId q = V(g.add(OpKind::Linear, {x, g.weight(file.add("wq", {H * Dh, D}, wq))}));
  q = V(g.add(OpKind::Reshape, {q}, Attrs{{"shape", std::vector<int64_t>{T, H, Dh}}}));
  ValueId k = V(g.add(OpKind::Linear, {x, g.weight(file.add("wk", {Dh, D}, wk))}));
  k = V(g.add(OpKind::Reshape, {k}, Attrs{{"shape", std::vector<int64_t>{T, 1, Dh}}}));
  ValueId kk = V(g.add(OpKind::Concat, {cache, k}, Attrs{{"axis", int64_t{0}}}));
  ValueId a = V(g.add(OpKind::Attention, {q, kk, kk}, Attrs{{"scale", 0.25}}));
  g.mark_output(a);
  g.mark_output(kk);

  // wq runs in bf16 (converted at load), wk in fp32.
  auto weights = CpuWeights::load(file.refs, {DType::BF16, DType::F32}, file.files());
  ASSERT_TRUE(weights.is_ok()) << weights.status().message();
  EXPECT_EQ(weights->owned_bytes(), uint64_t(H * Dh * D * 2));
  ExecutorOptions bf16_run;
  bf16_run.bf16_mqa_attention = true;  // as a bf16 pi0.5 run: one KV head -> bf16 attention
  auto ex = Executor::create(g, *weights, bf16_run);
  ASSERT_TRUE(ex.is_ok()) << ex.status().message();
  const auto xin = randv(size_t(T * D), 13), cin = randv(size_t(S0 * Dh), 14);
  std::memcpy(ex->input_data(ex->input_index("x")), xin.data(), xin.size() * 4);
  ex->bind_input(ex->input_index("cache"), cin.data());  // read in place, no copy
  ASSERT_TRUE(ex->run().is_ok());

  // bf16 weights: a bf16 x bf16 matmul, so the activations are rounded to bf16 too (as lerobot's bf16).
  std::vector<float> wq16(wq.size()), x16(xin.size());
  for (size_t i = 0; i < wq.size(); ++i) wq16[i] = bf16_to_f32(f32_to_bf16(wq[i]));
  for (size_t i = 0; i < xin.size(); ++i) x16[i] = bf16_to_f32(f32_to_bf16(xin[i]));
  std::vector<float> rq(size_t(T * H * Dh)), rk(size_t((S0 + T) * Dh)), ra(size_t(T * H * Dh));
  linear_f32(x16.data(), wq16.data(), nullptr, rq.data(), T, D, H * Dh);
  std::memcpy(rk.data(), cin.data(), cin.size() * 4);
  linear_f32(xin.data(), wk.data(), nullptr, rk.data() + S0 * Dh, T, D, Dh);
  std::vector<float> scratch(size_t(attention_scratch_floats(T, S0 + T)));
  attention(rq.data(), rk.data(), rk.data(), {}, ra.data(), T, H, 1, S0 + T, Dh, Dh, 0.25f, scratch.data(),
            int64_t(scratch.size()));
  for (size_t i = 0; i < rk.size(); ++i) EXPECT_NEAR(ex->data_f32(kk)[i], rk[i], 1e-5f * (1.0f + std::abs(rk[i]))) << i;
  // K/V have one head and the run is bf16: the attention runs in bf16 (DnnlAttention), so it
  // matches the fp32 reference to bf16 precision only.
  float amax = 0;
  for (float r : ra) amax = std::max(amax, std::abs(r));
  for (size_t i = 0; i < ra.size(); ++i) EXPECT_NEAR(ex->data_f32(a)[i], ra[i], 2e-2f * amax) << i;
}

// Several camera images through one graph (pi0.5's batched vision): PatchEmbed over [N,C,Y,X]
// gives each image's patch rows one after another, and Attention with kv_block keeps every block
// of rows to its own keys: the same bits as one image at a time, and as a block-diagonal mask.
TEST(CpuExecutor, BatchedImagesMatchOneImageAtATime) {
  const int64_t N = 3, C = 3, R = 8, P = 4, O = 8, H = 2, Dh = O / H, T = N * (R / P) * (R / P);
  FakeFile file;
  auto pw = randv(size_t(O * C * P * P), 21), pb = randv(size_t(O), 22);
  const ir::WeightRef wr = file.add("pw", {O, C, P, P}, pw), br = file.add("pb", {O}, pb);
  auto build = [&](int64_t images, bool mask) {
    ir::Graph g;
    const std::vector<int64_t> ishape =
        images > 0 ? std::vector<int64_t>{images, C, R, R} : std::vector<int64_t>{C, R, R};
    ValueId img = g.add_input("image", ValueInfo{DType::F32, ishape});
    ValueId h = V(g.add(OpKind::PatchEmbed, {img, g.weight(wr), g.weight(br)}));
    ValueId q = V(g.add(OpKind::Reshape, {h}, Attrs{{"shape", std::vector<int64_t>{-1, H, Dh}}}));
    Attrs at{{"scale", 0.5}};
    std::vector<ValueId> in{q, q, q};
    if (mask) in.push_back(g.add_input("mask", ValueInfo{DType::BOOL, {T, T}}));
    else if (images > 0) at.set("kv_block", T / images);
    g.mark_output(h);
    g.mark_output(V(g.add(OpKind::Attention, in, at)));
    return g;
  };
  auto weights = CpuWeights::load(file.refs, {DType::F32, DType::F32}, file.files());
  ASSERT_TRUE(weights.is_ok()) << weights.status().message();
  const auto imgs = randv(size_t(N * C * R * R), 23);
  auto run = [&](const ir::Graph& g, const float* image, const uint8_t* mask) {
    auto ex = Executor::create(g, *weights, {});
    EXPECT_TRUE(ex.is_ok()) << ex.status().message();
    std::memcpy(ex->input_data(ex->input_index("image")), image, g.info(g.inputs()[0]).bytes());
    if (mask) std::memcpy(ex->input_data(ex->input_index("mask")), mask, size_t(T * T));
    EXPECT_TRUE(ex->run().is_ok());
    std::vector<std::vector<float>> out;
    for (ValueId o : g.outputs()) out.emplace_back(ex->data_f32(o), ex->data_f32(o) + g.info(o).numel());
    return out;
  };
  const auto batched = run(build(N, false), imgs.data(), nullptr);
  ASSERT_EQ(batched[0].size(), size_t(T * O));
  const int64_t per = T / N;
  for (int64_t i = 0; i < N; ++i) {  // one image at a time: the same rows, bit for bit
    const auto one = run(build(0, false), imgs.data() + i * C * R * R, nullptr);
    for (size_t k = 0; k < 2; ++k)
      for (size_t j = 0; j < size_t(per * O); ++j) ASSERT_EQ(batched[k][size_t(i * per * O) + j], one[k][j]) << k << " " << j;
  }
  std::vector<uint8_t> diag(size_t(T * T));
  for (int64_t a = 0; a < T; ++a)
    for (int64_t b = 0; b < T; ++b) diag[size_t(a * T + b)] = a / per == b / per;
  const auto masked = run(build(N, true), imgs.data(), diag.data());
  for (size_t j = 0; j < masked[1].size(); ++j) EXPECT_NEAR(batched[1][j], masked[1][j], 1e-6f) << j;
  // kv_block needs no mask and a row count that is a multiple of it.
  ir::Graph bad;
  ValueId x = bad.add_input("x", ValueInfo{DType::F32, {10, 1, 4}});
  EXPECT_FALSE(bad.add(OpKind::Attention, {x, x, x}, Attrs{{"kv_block", int64_t{4}}}).is_ok());
}

// ExecutorOptions::memo_inputs: a "time" input feeding a small MLP whose result modulates x (as
// pi0.5's adaRMS). The time-only nodes are computed once per distinct time value, and results are
// bit-identical to an executor without the memo, in any order of values, also after slots are reused.
TEST(CpuExecutor, MemoReusesTimeOnlyNodesWithIdenticalResults) {
  const int64_t T = 4, D = 8;
  FakeFile file;
  auto w1 = randv(size_t(D * D), 21), b1 = randv(size_t(D), 22);
  ir::Graph g;
  ValueId x = g.add_input("x", ValueInfo{DType::F32, {T, D}});
  ValueId t = g.add_input("t", ValueInfo{DType::F32, {1}});
  ValueId te = V(g.add(OpKind::TimeEmbedding, {t}, Attrs{{"dim", D}, {"min_period", 4e-3}, {"max_period", 4.0}}));
  ValueId c = V(g.add(OpKind::Linear, {te, g.weight(file.add("w1", {D, D}, w1)), g.weight(file.add("b1", {D}, b1))}));
  c = V(g.add(OpKind::SiLU, {c}));
  ValueId c2 = V(g.add(OpKind::Reshape, {c}, Attrs{{"shape", std::vector<int64_t>{1, D}}}));
  // A view of a weight and a view of t: static, but never written back by the memo (a weight may
  // be read-only mapped memory).
  ValueId w2 = g.weight(file.add("w2", {D, D}, randv(size_t(D * D), 24)));
  ValueId w2v = V(g.add(OpKind::Reshape, {w2}, Attrs{{"shape", std::vector<int64_t>{D, D}}}));
  ValueId t_view = V(g.add(OpKind::Reshape, {t}, Attrs{{"shape", std::vector<int64_t>{1, 1}}}));
  ValueId h = V(g.add(OpKind::Linear, {x, w2v}));
  h = V(g.add(OpKind::Mul, {h, c2}));  // reads the memo result late in the schedule
  h = V(g.add(OpKind::Mul, {h, t_view}));
  ValueId y = V(g.add(OpKind::Add, {h, c2}));
  g.mark_output(y);
  g.mark_output(c);  // a memo value that is also a graph output
  ASSERT_TRUE(ir::verify(g).is_ok());
  std::vector<DType> run(file.refs.size(), DType::F32);
  auto weights = CpuWeights::load(file.refs, run, file.files());
  ASSERT_TRUE(weights.is_ok()) << weights.status().message();
  ExecutorOptions memo;
  memo.memo_inputs = {"t"};
  memo.memo_slots = 2;
  auto plain = Executor::create(g, *weights);
  auto cached = Executor::create(g, *weights, memo);
  ASSERT_TRUE(plain.is_ok() && cached.is_ok());
  EXPECT_EQ(plain->memo_nodes(), 0u);
  EXPECT_EQ(cached->memo_nodes(), 4u);  // time embedding, linear, silu, reshape (not the views)
  EXPECT_GT(cached->memo_bytes(), 0u);
  // Weights only the memo reads (a GPU may leave them in the file): w1, b1; not w2 (read through
  // a view by the non-memo Linear).
  auto only = exec::memo_only_weights(g, {"t"});
  std::sort(only.begin(), only.end());
  EXPECT_EQ(only, (std::vector<std::string>{"b1", "w1"}));
  EXPECT_TRUE(exec::memo_only_weights(g, {}).empty());
  EXPECT_EQ(exec::memo_only_weights(g, {"x"}), std::vector<std::string>{"w2"});  // keyed by x instead
  const auto xin = randv(size_t(T * D), 25);
  for (Executor* e : {&*plain, &*cached}) std::memcpy(e->input_data(e->input_index("x")), xin.data(), xin.size() * 4);
  // 1.0, 0.9 fill both slots; 0.8 replaces one; the rest are hits or refills.
  const float times[] = {1.0f, 0.9f, 1.0f, 0.9f, 0.8f, 0.8f, 1.0f, 0.9f};
  for (float tv : times) {
    for (Executor* e : {&*plain, &*cached}) {
      *static_cast<float*>(e->input_data(e->input_index("t"))) = tv;
      ASSERT_TRUE(e->run().is_ok());
    }
    EXPECT_EQ(std::memcmp(plain->data(y), cached->data(y), size_t(T * D) * 4), 0) << tv;
    EXPECT_EQ(std::memcmp(plain->data(c), cached->data(c), size_t(D) * 4), 0) << tv;
  }
  // Round-robin slots: 1.0 and 0.9 hit on their second run, 0.8 (in 1.0's slot) on its second;
  // then 1.0 and 0.9 were replaced and run again.
  EXPECT_EQ(cached->memo_hits(), 3u);
  EXPECT_EQ(plain->memo_hits(), 0u);
  // An input not named in memo_inputs changes the result as usual.
  const auto x2 = randv(size_t(T * D), 26);
  for (Executor* e : {&*plain, &*cached}) {
    std::memcpy(e->input_data(e->input_index("x")), x2.data(), x2.size() * 4);
    ASSERT_TRUE(e->run().is_ok());
  }
  EXPECT_EQ(std::memcmp(plain->data(y), cached->data(y), size_t(T * D) * 4), 0);
}

TEST(CpuExecutor, ErrorsAreClear) {
  FakeFile file;
  ir::Graph g;
  ValueId x = g.add_input("x", ValueInfo{DType::F32, {2, 2}});
  ValueId m = V(g.add(OpKind::MatMul, {x, x}, {}, "mm"));
  g.mark_output(m);
  auto weights = CpuWeights::load({}, {}, file.files());
  ASSERT_TRUE(weights.is_ok());
  auto ex = Executor::create(g, *weights);
  ASSERT_FALSE(ex.is_ok());
  EXPECT_EQ(ex.status().code(), StatusCode::Unsupported);
  EXPECT_NE(ex.status().message().find("'mm'"), std::string::npos) << ex.status().message();

  // A weight reference past the end of its file.
  ir::WeightRef r{"w", 0, 1000, DType::F32, {4}, 16, {}};
  auto bad = CpuWeights::load({r}, {DType::F32}, file.files());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("'w'"), std::string::npos);

  // A token id outside the table is a data error at run time, naming the position.
  FakeFile f2;
  ir::Graph g2;
  ValueId ids = g2.add_input("ids", ValueInfo{DType::I64, {2}});
  ValueId e = V(g2.add(OpKind::Embedding, {g2.weight(f2.add("table", {3, 4}, randv(12, 1))), ids}, Attrs{{"scale", 1.0}}));
  g2.mark_output(e);
  auto w2 = CpuWeights::load(f2.refs, {DType::F32}, f2.files());
  ASSERT_TRUE(w2.is_ok());
  auto ex2 = Executor::create(g2, *w2);
  ASSERT_TRUE(ex2.is_ok()) << ex2.status().message();
  int64_t* p = static_cast<int64_t*>(ex2->input_data(0));
  p[0] = 1;
  p[1] = 3;
  Status st = ex2->run();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("position 1"), std::string::npos) << st.message();
}

// An 8-bit weight (core/quant.h blob) anywhere but a Linear's weight or a gathered table is
// refused at planning, naming the node (a package can say anything; the codes must never be read
// as floats). As a Linear's weight the same blob runs. Converting to 8 bits at bind time is refused.
TEST(CpuExecutor, EightBitWeightOnlyFeedsALinear) {
  const int64_t n = 4, k = 8;
  std::vector<uint8_t> blob(stored_weight_bytes(DType::I8, {n, k}));
  auto* scales = reinterpret_cast<float*>(blob.data() + quant_scales_offset(n, k));
  const std::vector<float> w = randv(size_t(n * k), 5);
  for (int64_t r = 0; r < n; ++r) scales[r] = quantize_row(w.data() + r * k, k, DType::I8, blob.data() + r * k);
  ir::WeightRef ref{"wq", 0, 0, DType::I8, {n, k}, blob.size(), {}};
  const std::vector<WeightFile> files{WeightFile{blob.data(), blob.size(), "fake", nullptr}};
  auto weights = CpuWeights::load({ref}, {DType::I8}, files);
  ASSERT_TRUE(weights.is_ok()) << weights.status().message();

  // A program records its weights' checkpoint dtype (here f32); the engine's table says I8.
  ir::WeightRef prog = ref;
  prog.dtype = DType::F32;
  prog.bytes = uint64_t(n * k) * 4;
  ir::Graph bad;
  ValueId x = bad.add_input("x", ValueInfo{DType::F32, {n, k}});
  bad.mark_output(V(bad.add(OpKind::Add, {x, bad.weight(prog)}, {}, "sneaky_add")));
  auto ex = Executor::create(bad, *weights);
  ASSERT_FALSE(ex.is_ok());
  EXPECT_EQ(ex.status().code(), StatusCode::InvalidFormat);
  EXPECT_NE(ex.status().message().find("'sneaky_add'"), std::string::npos) << ex.status().message();

  ir::Graph good;
  ValueId x2 = good.add_input("x", ValueInfo{DType::F32, {3, k}});
  good.mark_output(V(good.add(OpKind::Linear, {x2, good.weight(prog)}, {}, "lin")));
  auto ok = Executor::create(good, *weights);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  std::fill_n(static_cast<float*>(ok->input_data(0)), 3 * k, 0.5f);
  ASSERT_TRUE(ok->run().is_ok());
  const float* y = static_cast<const float*>(ok->data(good.outputs()[0]));
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t kk = 0; kk < k; ++kk) s += 0.5 * double(int8_t(blob[size_t(j * k + kk)]));
    EXPECT_NEAR(y[j], s * scales[j], 1e-5) << j;
  }

  std::vector<uint8_t> raw(prog.bytes);
  auto conv = CpuWeights::load({prog}, {DType::I8}, {WeightFile{raw.data(), raw.size(), "fake", nullptr}});
  ASSERT_FALSE(conv.is_ok());
  EXPECT_NE(conv.status().message().find("as compiled"), std::string::npos) << conv.status().message();
}
