// The MoE layers' grouped GEMMs (ops/cuda/grouped_gemm.h) against cuBLASLt one expert at a
// time (GemmRunner, its heuristic's choice), label gpu; skipped with a message where no GPU
// is visible. The reference's bf16-output GEMMs are computed into fp32 and the grouped
// kernel's bf16 outputs judged by the op table's gemm_bf16 class (twice the reference's own
// bf16 rounding error); the weight gradient, added into fp32 grads on both sides, by
// accumulated_f32. Each expert is judged alone, so a wrong small expert is not hidden in
// the others' norm. Rows past offsets[E] keep their bits, and so does an expert's gradient
// when it has no rows.
//
// Shapes: small odd ones (8 experts, n and k not multiples of the tiles, empty experts at
// either end and between, slack rows), all rows in one expert, no rows at all, Qwen3-30B-A3B
// (128 experts, about 1,024 rows each, uneven) and Qwen3-235B-A22B's expert shapes (the 16
// experts a rank holds at EP 8); and a run's bits twice over, through two workspaces.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/grouped_gemm_cases.h"
#include "ops/op_table.h"
#include "support/compare.h"

namespace loom {
namespace {

using test::ExpertShape;

// bf16 bits of rows the grouped GEMM must not write: 0x5a5a is about 1.5e16, finite.
constexpr int kSentinelByte = 0x5a;
constexpr uint16_t kSentinelBits = 0x5a5a;

// One MoE layer's operands on the device: x [R, k], weights [E, n, k], d_out [R, n], the
// grouped outputs (out [R, n], d_x [R, k], d_w [E, n, k] fp32) and the reference's (fp32).
struct Layer {
  GroupedGemmShape shape;
  std::vector<int32_t> offsets;
  std::vector<float> grads_start;
  int32_t* offsets_device = nullptr;
  void *x = nullptr, *weights = nullptr, *d_out = nullptr, *out = nullptr, *d_x = nullptr;
  float *d_w = nullptr, *ref_out = nullptr, *ref_d_x = nullptr, *ref_d_w = nullptr;
  void* workspace = nullptr;  // the grouped GEMMs' (GroupedGemmRunner::workspace_bytes)
};

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device visible: the grouped GEMM tests did not run";
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // The reference takes cuBLASLt's heuristic choice: no timed candidates for each of the
    // hundreds of per-expert shapes.
    setenv("LOOM_GEMM_AUTOTUNE", "0", 1);
    reference_ = std::make_unique<GemmRunner>(stream_);
    unsetenv("LOOM_GEMM_AUTOTUNE");
    grouped_ = std::make_unique<GroupedGemmRunner>(stream_);
  }
  void TearDown() override {
    grouped_.reset();
    reference_.reset();
    if (stream_) cudaStreamDestroy(stream_);
  }

  void upload(void* device, const void* host, size_t bytes) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  template <typename T>
  std::vector<T> download(const void* device, int64_t count) {
    std::vector<T> host(static_cast<size_t>(count));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    LOOM_CUDA_CHECK(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

  // Random operands for `counts` rows an expert and `slack` rows past them; the outputs
  // filled with the sentinel, both gradients with the same random start.
  Layer make_layer(DeviceArena& arena, const ExpertShape& expert, const std::vector<int32_t>& counts,
                   int64_t slack, uint64_t seed) {
    Layer l;
    l.offsets = test::offsets_of(counts);
    const int64_t e = static_cast<int64_t>(counts.size());
    l.shape = {e, l.offsets.back() + slack, expert.n, expert.k};
    const int64_t r = l.shape.rows, n = expert.n, k = expert.k;
    const auto bytes = [&](int64_t count, const char* what) { return arena.allocate_bytes(count, what); };
    l.offsets_device = static_cast<int32_t*>(bytes((e + 1) * 4, "offsets"));
    l.x = bytes(r * k * 2, "x");
    l.weights = bytes(e * n * k * 2, "weights");
    l.d_out = bytes(r * n * 2, "d_out");
    l.out = bytes(r * n * 2, "out");
    l.d_x = bytes(r * k * 2, "d_x");
    l.d_w = static_cast<float*>(bytes(e * n * k * 4, "d_w"));
    l.ref_out = static_cast<float*>(bytes(r * n * 4, "reference out"));
    l.ref_d_x = static_cast<float*>(bytes(r * k * 4, "reference d_x"));
    l.ref_d_w = static_cast<float*>(bytes(e * n * k * 4, "reference d_w"));
    l.workspace = bytes(static_cast<int64_t>(GroupedGemmRunner::workspace_bytes(e)), "workspace");
    upload(l.offsets_device, l.offsets.data(), l.offsets.size() * 4);
    upload(l.x, test::random_bf16_bits(r * k, seed, 1.0f).data(), static_cast<size_t>(r * k * 2));
    upload(l.weights, test::random_bf16_bits(e * n * k, seed + 1, 1.0f).data(),
           static_cast<size_t>(e * n * k * 2));
    upload(l.d_out, test::random_bf16_bits(r * n, seed + 2, 1.0f).data(), static_cast<size_t>(r * n * 2));
    l.grads_start = test::random_floats(e * n * k, seed + 3, 4.0f);
    reset_grads(l);
    LOOM_CUDA_CHECK(cudaMemsetAsync(l.out, kSentinelByte, static_cast<size_t>(r * n * 2), stream_));
    LOOM_CUDA_CHECK(cudaMemsetAsync(l.d_x, kSentinelByte, static_cast<size_t>(r * k * 2), stream_));
    return l;
  }
  void reset_grads(const Layer& l) {
    const size_t bytes = l.grads_start.size() * 4;
    upload(l.d_w, l.grads_start.data(), bytes);
    upload(l.ref_d_w, l.grads_start.data(), bytes);
  }

  void run_grouped(const Layer& l) { run_grouped(l, l.workspace); }
  void run_grouped(const Layer& l, void* workspace) {
    grouped_->forward(l.shape, l.offsets_device, l.x, l.weights, l.out, workspace);
    grouped_->backward_input(l.shape, l.offsets_device, l.d_out, l.weights, l.d_x, workspace);
    grouped_->backward_weight(l.shape, l.offsets_device, l.d_out, l.x, l.d_w, workspace);
  }

  // cuBLASLt, one expert at a time (experts with no rows have no GEMM).
  void run_reference(const Layer& l) {
    const int64_t n = l.shape.n, k = l.shape.k;
    const auto bf16_at = [](void* base, int64_t elements) { return static_cast<uint16_t*>(base) + elements; };
    for (size_t e = 0; e + 1 < l.offsets.size(); ++e) {
      const int64_t begin = l.offsets[e], rows = l.offsets[e + 1] - begin;
      if (rows == 0) continue;
      const void* w = bf16_at(l.weights, static_cast<int64_t>(e) * n * k);
      // out_e [rows, n] = x_e [rows, k] · W_eᵀ
      reference_->run({rows, n, k, false, true, DType::f32, false}, bf16_at(l.x, begin * k), w,
                      l.ref_out + begin * n);
      // d_x_e [rows, k] = d_out_e [rows, n] · W_e [n, k]
      reference_->run({rows, k, n, false, false, DType::f32, false}, bf16_at(l.d_out, begin * n), w,
                      l.ref_d_x + begin * k);
      // d_w_e [n, k] += d_out_eᵀ · x_e
      reference_->run({n, k, rows, true, false, DType::f32, true}, bf16_at(l.d_out, begin * n),
                      bf16_at(l.x, begin * k), l.ref_d_w + static_cast<int64_t>(e) * n * k);
    }
  }

  // Judges one bf16 output [R, width] against its fp32 reference, expert by expert, and
  // checks that the rows past offsets[E] keep the sentinel.
  void expect_bf16_output(const Layer& l, const void* got_device, const float* ref_device, int64_t width,
                          const std::string& what) {
    const std::vector<uint16_t> got = download<uint16_t>(got_device, l.shape.rows * width);
    const std::vector<float> ref = download<float>(ref_device, l.shape.rows * width);
    double worst = 0, worst_bound = 0;
    int64_t worst_expert = -1, failed = 0;
    for (size_t e = 0; e + 1 < l.offsets.size(); ++e) {
      const size_t begin = static_cast<size_t>(l.offsets[e] * width),
                   end = static_cast<size_t>(l.offsets[e + 1] * width);
      if (begin == end) continue;
      std::vector<float> g(end - begin),
          r(ref.begin() + static_cast<std::ptrdiff_t>(begin), ref.begin() + static_cast<std::ptrdiff_t>(end));
      for (size_t i = begin; i < end; ++i) g[i - begin] = bf16_to_float(bf16{got[i]});
      const double error = test::relative_l2(g, r);
      const double bound = test::tolerance(test::Tolerance::gemm_bf16, r);
      if (error > bound) ++failed;
      if (error / bound > (worst_bound > 0 ? worst / worst_bound : 0)) {
        worst = error;
        worst_bound = bound;
        worst_expert = static_cast<int64_t>(e);
      }
    }
    EXPECT_EQ(failed, 0) << what << ": " << failed << " experts past gemm_bf16; the worst, expert "
                         << worst_expert << ", relative L2 " << worst << " (bound " << worst_bound << ")";
    int64_t written = 0;
    for (size_t i = static_cast<size_t>(l.offsets.back() * width); i < got.size(); ++i)
      written += got[i] != kSentinelBits;
    EXPECT_EQ(written, 0) << what << ": values past offsets[E] written";
  }

  // The weight gradients: each expert with rows against the reference (accumulated_f32);
  // each without keeps its starting bits.
  void expect_weight_grads(const Layer& l) {
    const int64_t per_expert = l.shape.n * l.shape.k;
    const std::vector<float> got = download<float>(l.d_w, l.shape.experts * per_expert);
    const std::vector<float> ref = download<float>(l.ref_d_w, l.shape.experts * per_expert);
    for (size_t e = 0; e + 1 < l.offsets.size(); ++e) {
      const int64_t begin = static_cast<int64_t>(e) * per_expert;
      const float* g = got.data() + begin;
      if (l.offsets[e + 1] == l.offsets[e]) {
        EXPECT_EQ(std::memcmp(g, l.grads_start.data() + begin, static_cast<size_t>(per_expert) * 4), 0)
            << "expert " << e << " has no rows, yet its gradient changed";
        continue;
      }
      // The bound is judged on the update alone (reference minus start): the start's
      // magnitude would otherwise hide an error in what was added.
      std::vector<float> added_ref(static_cast<size_t>(per_expert)), added_got(added_ref.size());
      for (int64_t i = 0; i < per_expert; ++i) {
        const float start = l.grads_start[static_cast<size_t>(begin + i)];
        added_ref[static_cast<size_t>(i)] = ref[static_cast<size_t>(begin + i)] - start;
        added_got[static_cast<size_t>(i)] = g[i] - start;
      }
      const double error = test::relative_l2(added_got, added_ref);
      EXPECT_LE(error, test::tolerance(test::Tolerance::accumulated_f32, added_ref))
          << "d_w of expert " << e << " (" << l.offsets[e + 1] - l.offsets[e] << " rows)";
    }
  }

  void check(const ExpertShape& expert, const std::vector<int32_t>& counts, int64_t slack, uint64_t seed) {
    SCOPED_TRACE(std::string(expert.name) + ", " + std::to_string(counts.size()) + " experts");
    DeviceArena arena("grouped GEMM test tensors");
    const Layer l = make_layer(arena, expert, counts, slack, seed);
    run_grouped(l);
    run_reference(l);
    expect_bf16_output(l, l.out, l.ref_out, l.shape.n, "forward");
    expect_bf16_output(l, l.d_x, l.ref_d_x, l.shape.k, "backward_input");
    expect_weight_grads(l);
  }

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<GemmRunner> reference_;
  std::unique_ptr<GroupedGemmRunner> grouped_;
};

// n and k not multiples of any tile; experts of 0, 1 and tile-straddling row counts, empty
// ones first, last and between; rows past offsets[E].
TEST_F(GroupedGemmTest, SmallOddShapesWithEmptyExperts) {
  check({"136 x 200", 136, 200}, {37, 0, 129, 1, 256, 0, 300, 77}, 13, 1);
  check({"72 x 40", 72, 40}, {0, 5, 130, 0, 64, 255, 3, 0}, 0, 2);
  check({"264 x 328", 264, 328}, {0, 0, 1, 2, 3, 127, 128, 129}, 200, 3);
}

TEST_F(GroupedGemmTest, AllRowsInOneExpert) {
  check({"512 x 256", 512, 256}, {0, 0, 0, 1500, 0, 0, 0, 0}, 100, 4);
  check(test::kA3bDown, {0, 0, 0, 0, 0, 0, 0, 4099}, 0, 5);
}

// No expert has a row: no tile anywhere, nothing written.
TEST_F(GroupedGemmTest, NoRowsAtAll) {
  check({"64 x 64", 64, 64}, {0, 0, 0, 0}, 50, 6);
}

TEST_F(GroupedGemmTest, Qwen3_30B_A3B) {
  check(test::kA3bGateUp, test::uneven_counts(128, 1024, 7), 64, 7);
  check(test::kA3bDown, test::uneven_counts(128, 1024, 8), 0, 8);
}

// The 16 experts a rank holds at EP 8.
TEST_F(GroupedGemmTest, Qwen3_235B_A22B) {
  check(test::k235bGateUp, test::uneven_counts(16, 1024, 9), 8, 9);
  check(test::k235bDown, test::uneven_counts(16, 1024, 10), 8, 10);
}

// Two runs give the same bits, the second through another workspace (CUTLASS's arguments
// made anew): Zipf-uneven experts (the busiest with thousands of rows, the least with
// about 180) at the 30B-A3B gate_up shape.
TEST_F(GroupedGemmTest, RunsAreBitwiseDeterministic) {
  DeviceArena arena("grouped GEMM test tensors");
  const Layer l = make_layer(arena, test::kA3bGateUp, test::zipf_counts(128, 128 * 1024, 11), 0, 11);
  const int64_t r = l.shape.rows, n = l.shape.n, k = l.shape.k, e = l.shape.experts;
  run_grouped(l);
  const std::vector<uint16_t> out = download<uint16_t>(l.out, r * n), d_x = download<uint16_t>(l.d_x, r * k);
  const std::vector<uint32_t> d_w = download<uint32_t>(l.d_w, e * n * k);
  reset_grads(l);
  LOOM_CUDA_CHECK(cudaMemsetAsync(l.out, 0, static_cast<size_t>(r * n * 2), stream_));
  LOOM_CUDA_CHECK(cudaMemsetAsync(l.d_x, 0, static_cast<size_t>(r * k * 2), stream_));
  void* workspace =
      arena.allocate_bytes(static_cast<int64_t>(GroupedGemmRunner::workspace_bytes(e)), "workspace");
  run_grouped(l, workspace);
  EXPECT_TRUE(download<uint16_t>(l.out, r * n) == out) << "forward";
  EXPECT_TRUE(download<uint16_t>(l.d_x, r * k) == d_x) << "backward_input";
  EXPECT_TRUE(download<uint32_t>(l.d_w, e * n * k) == d_w) << "backward_weight";
}

}  // namespace
}  // namespace loom
