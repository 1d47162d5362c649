// The op test table: ops × shapes × tolerance class, one list that both op suites read.
// Every method of class Ops has a case (test_cpu_ops' OpTableCoverage fails otherwise).
//
//   test_cpu_ops.cpp   every case's backward against central finite differences of its
//                      forward on the CPU backend (fp32), on sampled gradient entries; that
//                      every Ops method has a case; each case's FLOP and byte counts.
//   test_cuda_ops.cpp  every case's outputs on the GPU against the CPU twin's, each judged
//                      by its tolerance class (label gpu).
//   op_table_perf      the same cases on the GPU, timed: TFLOP/s or GB/s a case, JSON lines.
//
// Shapes are Qwen3's: hidden 1,024 (0.6B), 2,048 (1.7B), 2,560 (4B), 4,096 (8B) and 5,120
// (14B, 32B); head_dim 128 with 16/8, 32/8, 40/8 and 64/8 heads; ffn 3,072 to 25,600; odd
// token counts over rows of unequal lengths. A few more reach a CUDA kernel's other paths
// (a hidden of 8,192, more tokens than a backward has weight-gradient blocks, widths that are
// not a multiple of 8), and the small shapes of the first tests stay. The FP8 cases run at
// hidden 2,560 to 5,120 and ffn up to 25,600 over token counts padded as the FP8 layer pads
// them (to 16 for tensor scaling, 128 for block scaling); they and the other forward-only
// ops (moves, reductions) have no finite differences, only the GPU's comparison. The
// mixture-of-experts cases run at Qwen3-30B-A3B's and 235B-A22B's shapes (128 experts, top-8,
// hidden 2,048 and 4,096, expert ffn 768 and 1,536) over skewed routings with empty experts,
// and at 8 experts, top-2, 37 tokens for finite differences; the experts' GEMMs at a step's
// size are perf-only (`compared` false), the CPU twin running them at fewer rows and experts.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ops/ops.h"

namespace loom::test {

// How a GPU output is judged against the CPU twin's: the relative L2 error it may have
// (tolerance() holds the numbers and why).
enum class Tolerance {
  exact,             // bit for bit: moves, FP8 casts and censuses, maxima, host copies
  bf16,              // bf16 outputs of elementwise, norm and rope kernels
  reduced_f32,       // fp32 outputs reduced from bf16 inputs
  rotated_f32,       // fp32 sums over rotated values (the q/k-norm weight gradients)
  accumulated_f32,   // fp32 GEMM outputs accumulated in fp32 on both sides
  gemm_bf16,         // bf16 GEMM outputs
  bf16_logits,       // the loss over bf16 logits (nll)
  bf16_logit_grads,  // gradients through bf16 logits
  attention_grads,   // attention's gradients through cuDNN's bf16 probabilities and dS
  fp8_gemm,          // FP8 GEMM outputs: a bound from the GEMM's operands (Arg::operands)
};

// The relative L2 error a GPU output may have against `reference`, the CPU twin's output
// (not for fp8_gemm, whose bound needs the operands: the overload below).
double tolerance(Tolerance tolerance, const std::vector<float>& reference);
const char* tolerance_name(Tolerance tolerance);

// The dtype an argument has on a backend: its activation dtype, fp32 always, int32 ids, an
// FP8 format or int64 (the same on both backends), or fp32 in host memory (what copy_to_host
// and sum hand back, on both backends).
enum class Kind { activation, f32, ids, e4m3, e5m2, i64, host };
// The dtype of `kind` on a backend whose activation dtype is `activation`.
DType kind_dtype(Kind kind, DType activation);

// The values an argument starts with; both backends get the same ones (random values are
// rounded to bf16, so the GPU's bf16 copy holds them exactly).
struct Fill {
  // spread: N(0, scale²) values each times 2^-u, u uniform in 0..23, so that FP8 casts
  // flush some to zero. positions: distinct ids in [0, vocab), shuffled (gather and scatter
  // indexes, the MoE permutation's places).
  //
  // The mixture of experts' (ops.h): experts: rows i32[T, k] of k distinct expert ids in
  // [0, vocab) (a token's top-k), skewed: a few experts take many pairs, an eighth of them
  // none. offsets: i32[E + 1] group boundaries over vocab rows, from 0, non-decreasing, the
  // first and last groups and an eighth of the others empty, ending `masked` of the rows
  // short of vocab (rows that belong to no expert). logits: router logits [T, E], each row's
  // values distinct multiples of `scale` (a power of two, exact in bf16) in [−256, 256]·scale:
  // two probs differ by at least a factor e^scale, far above exp's rounding, so both backends
  // pick the same top-k, and a finite-difference step below scale reorders none; with
  // `specials`, each row's four largest values copied onto other experts (exact ties, which
  // go to the lower id). tiled: the values of the earlier argument `of`, repeated (the
  // cotangent of a sum over tokens of a per-expert tensor's gradient).
  enum class How { zeros, normal, constant, ids, spread, positions, experts, offsets, logits, tiled };
  How how = How::zeros;
  float mean = 0, scale = 1;  // normal: N(mean, scale²); constant: mean (a byte's or an int64's value)
  int64_t vocab = 0;          // ids: uniform in [0, vocab),
  double masked = 0;          // this fraction of them −1
  bool specials = false;      // spread: the first two values +inf and NaN; logits: ties
  std::string of = {};        // tiled: the argument whose values repeat
};

struct Arg {
  std::string name;
  Shape shape;
  Kind kind = Kind::activation;
  Fill fill;
  bool output = false;                     // written by the op: compared between backends
  Tolerance tolerance = Tolerance::exact;  // exact: bit for bit
  std::vector<std::string> operands =
      {};  // fp8_gemm: the two arguments the GEMM's FP8 operands are cast from
};

// The tensors of one call of a case, by argument name.
using Args = std::map<std::string, Tensor>;

struct OpCase {
  std::string name;  // op and shape, a gtest name: rmsnorm_t7_h1024
  // The Ops methods its calls make (setup's included): OpTableCoverage reads them.
  std::vector<std::string> ops;
  std::vector<Arg> args;
  // Run once before the forward, untimed by the perf mode: what makes the operands of the op
  // a case times (the FP8 casts before an FP8 GEMM or a census). Its outputs are compared too.
  std::function<void(Ops&, const Args&)> setup;
  std::function<void(Ops&, const Args&)> forward;
  std::function<void(Ops&, const Args&)> backward;  // empty for a forward-only case
  // The finite-difference loss L = Σ forward output · cotangent over these pairs (the
  // cotangent is the backward's d_out input), and the inputs it is differentiated by, each
  // with the backward output holding its gradient (which the backward adds to).
  std::vector<std::pair<std::string, std::string>> loss;
  std::vector<std::pair<std::string, std::string>> gradients;
  int samples = 48;                // gradient entries checked by finite differences, per input
  bool finite_differences = true;  // false: a shape only a CUDA kernel's path needs, too large
  bool cuda = true;                // false: a shape the CUDA kernels do not take
  // false: too large for the CPU twin to run (the experts' GEMMs at a model's size):
  // test_cuda_ops passes over it, op_table_perf times it.
  bool compared = true;
  // What one forward + backward does, for the perf mode: the FLOPs of its GEMMs and
  // attention (0 for the other ops), and the bytes it reads and writes on the GPU (0: each
  // argument's bytes once, op_case_bytes).
  double flops = 0;
  double bytes = 0;
};

std::vector<OpCase> op_table();
// gtest names a case's test, and prints a failing one's parameter, by the case's name.
struct OpCaseName {
  std::string operator()(const ::testing::TestParamInfo<OpCase>& param) const { return param.param.name; }
};
void PrintTo(const OpCase& c, std::ostream* out);

// An argument's starting values on the host: `values` (ids in `ids`; FP8 and int64
// arguments' bytes in `bytes`).
struct HostArg {
  std::vector<float> values;
  std::vector<int32_t> ids;
  std::vector<uint8_t> bytes;
};
using HostArgs = std::map<std::string, HostArg>;

// Every argument's starting values, from `seed`.
HostArgs op_case_values(const OpCase& c, uint32_t seed);
// CPU tensors over `values` (which must outlive them), of the CPU backend's dtypes.
Args host_tensors(const OpCase& c, HostArgs& values);

// The relative L2 error `arg`, a GPU output, may have against `reference`, the CPU twin's,
// the case having started from `start`.
double tolerance(const Arg& arg, const HostArgs& start, const std::vector<float>& reference);
// How many values of two copies of an argument differ in their bits.
int64_t bits_differ(const HostArg& a, const HostArg& b);
// The bytes one forward + backward of `c` reads and writes on the GPU: c.bytes, or where it
// is 0 each argument's bytes once (bf16 activations), what an op moves that reads each input
// and writes each output once.
double op_case_bytes(const OpCase& c);

}  // namespace loom::test
