// The op test table: ops × shapes × tolerance class, one list that both op suites read.
//
//   test_cpu_ops.cpp   every case's backward against central finite differences of its
//                      forward on the CPU backend (fp32), on sampled gradient entries.
//   test_cuda_ops.cpp  every case's forward and backward outputs on the GPU against the CPU
//                      twin's, each judged by its tolerance class (label gpu).
//
// Shapes are Qwen3's: hidden 1,024 (0.6B), 2,048 (1.7B), 2,560 (4B), 4,096 (8B) and 5,120
// (14B, 32B); head_dim 128 with 16/8, 32/8, 40/8 and 64/8 heads; ffn 3,072 to 25,600; odd
// token counts over rows of unequal lengths. A few more reach a CUDA kernel's other paths
// (a hidden of 8,192, more tokens than a backward has weight-gradient blocks, widths that are
// not a multiple of 8), and the small shapes of the first tests stay.
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
  exact,             // moves and gathers
  bf16,              // bf16 outputs of elementwise, norm and rope kernels
  reduced_f32,       // fp32 outputs reduced from bf16 inputs
  rotated_f32,       // fp32 sums over rotated values (the q/k-norm weight gradients)
  accumulated_f32,   // fp32 GEMM outputs accumulated in fp32 on both sides
  gemm_bf16,         // bf16 GEMM outputs
  bf16_logits,       // the loss over bf16 logits (nll)
  bf16_logit_grads,  // gradients through bf16 logits
};

// The relative L2 error a GPU output may have against `reference`, the CPU twin's output.
double tolerance(Tolerance tolerance, const std::vector<float>& reference);
const char* tolerance_name(Tolerance tolerance);

// The dtype an argument has on a backend: its activation dtype, fp32 always, or int32 ids.
enum class Kind { activation, f32, ids };

// The values an argument starts with; both backends get the same ones (random values are
// rounded to bf16, so the GPU's bf16 copy holds them exactly).
struct Fill {
  enum class How { zeros, normal, constant, ids };
  How how = How::zeros;
  float mean = 0, scale = 1;  // normal: N(mean, scale²); constant: mean
  int64_t vocab = 0;          // ids: uniform in [0, vocab),
  double masked = 0;          // this fraction of them −1
};

struct Arg {
  std::string name;
  Shape shape;
  Kind kind = Kind::activation;
  Fill fill;
  bool output = false;  // written by the op: compared between backends
  Tolerance tolerance = Tolerance::exact;
};

// The tensors of one call of a case, by argument name.
using Args = std::map<std::string, Tensor>;

struct OpCase {
  std::string name;  // op and shape, a gtest name: rmsnorm_t7_h1024
  std::vector<Arg> args;
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
};

std::vector<OpCase> op_table();
// gtest names a case's test, and prints a failing one's parameter, by the case's name.
struct OpCaseName {
  std::string operator()(const ::testing::TestParamInfo<OpCase>& param) const { return param.param.name; }
};
void PrintTo(const OpCase& c, std::ostream* out);

// An argument's starting values on the host: `values` (ids in `ids`).
struct HostArg {
  std::vector<float> values;
  std::vector<int32_t> ids;
};
using HostArgs = std::map<std::string, HostArg>;

// Every argument's starting values, from `seed`.
HostArgs op_case_values(const OpCase& c, uint32_t seed);
// fp32 / int32 CPU tensors over `values` (which must outlive them).
Args host_tensors(const OpCase& c, HostArgs& values);

}  // namespace loom::test
