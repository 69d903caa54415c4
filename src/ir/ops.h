// The op table of the graph IR: one X-macro row per op kind (name, arity, outputs), kept in one
// place. Semantics and shapes are documented per row; shape inference lives in ops.cpp.
#pragma once

#include <cstdint>

namespace vlac::ir {

// Arity: n_in_min..n_in_max inputs (-1 = any number), n_out outputs.
// Shapes are row-major, outermost first; "..." is any number of leading dims.
//
//   kind           name              in_min in_max n_out   inputs -> outputs, attributes
#define VLAC_IR_OPS(X)                                                                          \
  X(Input,         "input",           0,     0,     1)  /* -> given info; attr name          */ \
  X(Constant,      "constant",        0,     0,     1)  /* -> given info filled with "value"  */ \
  X(Weight,        "weight",          0,     0,     1)  /* -> graph.weights[node.weight]      */ \
  X(Linear,        "linear",          2,     3,     1)  /* x[...,K] W[N,K] b?[N] -> [...,N]   */ \
  X(MatMul,        "matmul",          2,     2,     1)  /* a[...,M,K] b[...,K,N] -> [...,M,N] */ \
  X(Add,           "add",             2,     2,     1)  /* numpy broadcast                    */ \
  X(Sub,           "sub",             2,     2,     1)  /* numpy broadcast                    */ \
  X(Mul,           "mul",             2,     2,     1)  /* numpy broadcast                    */ \
  X(Scale,         "scale",           1,     1,     1)  /* x * attr scale                     */ \
  X(LayerNorm,     "layer_norm",      3,     3,     1)  /* x[...,D] w[D] b[D]; eps            */ \
  X(RMSNorm,       "rms_norm",        2,     2,     1)  /* x[...,D] w[D], x*rsqrt*(1+w); eps  */ \
  X(AdaRMSNorm,    "ada_rms_norm",    2,     2,     2)  /* x[...,D] mod[3D] -> out, gate[D]   */ \
  X(GeluTanh,      "gelu_tanh",       1,     1,     1)  /* elementwise                        */ \
  X(GeGLU,         "geglu",           2,     2,     1)  /* gelu_tanh(gate) * up, same shapes  */ \
  X(SiLU,          "silu",            1,     1,     1)  /* elementwise                        */ \
  X(RoPE,          "rope",            2,     2,     1)  /* x[T,H,Dh] pos[T] int; base         */ \
  X(Softmax,       "softmax",         1,     1,     1)  /* over the last dim, f32             */ \
  X(Attention,     "attention",       3,     4,     1)  /* q[T,H,D] k[S,Hk,D] v[S,Hk,Dv] m?[T,S] -> [T,H,Dv]; scale, kv_block */ \
  X(PatchEmbed,    "patch_embed",     2,     3,     1)  /* img[N?,C,Y,X] W[O,C,kh,kw] b?[O] -> [N*Y/kh*X/kw, O] */ \
  X(Embedding,     "embedding",       2,     2,     1)  /* table[V,D] ids[T] int -> [T,D]; scale */ \
  X(Concat,        "concat",          1,     -1,    1)  /* along attr axis                    */ \
  X(Slice,         "slice",           1,     1,     1)  /* attr axis, start, end              */ \
  X(Reshape,       "reshape",         1,     1,     1)  /* attr shape (one -1 allowed)        */ \
  X(Transpose,     "transpose",       1,     1,     1)  /* attr perm                          */ \
  X(Cast,          "cast",            1,     1,     1)  /* attr dtype (safetensors name)      */ \
  X(TimeEmbedding, "time_embedding",  1,     1,     1)  /* t[1] -> [dim] sin|cos; dim, min_period, max_period */ \
  X(EulerStep,     "euler_step",      2,     2,     1)  /* x, v -> x + dt*v; attr dt          */

enum class OpKind : uint8_t {
#define VLAC_IR_OP_ENUM(kind, name, in_min, in_max, n_out) kind,
  VLAC_IR_OPS(VLAC_IR_OP_ENUM)
#undef VLAC_IR_OP_ENUM
};

struct OpInfo {
  const char* name;  // lower_snake_case, as printed
  int8_t n_in_min;
  int8_t n_in_max;   // -1: variadic
  int8_t n_out;
};

/// The table row of `op`. Never fails for a valid enum value.
const OpInfo& op_info(OpKind op);
inline const char* op_name(OpKind op) { return op_info(op).name; }
/// Number of op kinds in the table.
int op_count();

}  // namespace vlac::ir
