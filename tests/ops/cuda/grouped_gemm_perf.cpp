// The MoE grouped GEMMs' speed (ops/cuda/grouped_gemm.h), one JSON line a shape on stdout:
// TFLOP/s (2·R·n·k a call, R = offsets[E]) of forward, backward_input and backward_weight,
// and of the same work as cuBLASLt GEMMs one expert at a time (GemmRunner, autotuned), the
// path a MoE layer would take without the grouped kernel. Each call is warmed up (the
// cuBLASLt loop's autotuning included), then repeated for about 0.2 s between two events.
//
//   grouped_gemm_perf [substring]   only the shapes whose name contains it
//
// Shapes: Qwen3-30B-A3B's gate_up and down over 128 experts × 1,024 rows, even and
// Zipf-uneven; Qwen3-235B-A22B's over 128 experts × 1,024 rows and over the 16 experts a
// rank holds at EP 8 × 2,048 rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/grouped_gemm_cases.h"

namespace loom {
namespace {

struct PerfCase {
  std::string name;
  test::ExpertShape expert;
  std::vector<int32_t> counts;
};

std::vector<PerfCase> perf_cases() {
  using test::even_counts, test::zipf_counts;
  return {
      {"30b-a3b gate_up e128 even", test::kA3bGateUp, even_counts(128, 1024)},
      {"30b-a3b gate_up e128 zipf", test::kA3bGateUp, zipf_counts(128, 128 * 1024, 1)},
      {"30b-a3b down e128 even", test::kA3bDown, even_counts(128, 1024)},
      {"30b-a3b down e128 zipf", test::kA3bDown, zipf_counts(128, 128 * 1024, 2)},
      {"235b-a22b gate_up e128 even", test::k235bGateUp, even_counts(128, 1024)},
      {"235b-a22b down e128 even", test::k235bDown, even_counts(128, 1024)},
      {"235b-a22b gate_up e16 ep8", test::k235bGateUp, even_counts(16, 2048)},
      {"235b-a22b down e16 ep8", test::k235bDown, even_counts(16, 2048)},
  };
}

// Seconds a call takes: warmed up twice, then as many as fill about 0.2 s timed together.
double seconds_per_call(cudaStream_t stream, const std::function<void()>& call) {
  cudaEvent_t start = nullptr, stop = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreate(&start));
  LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  const auto time = [&](int calls) {
    LOOM_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < calls; ++i) call();
    LOOM_CUDA_CHECK(cudaEventRecord(stop, stream));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) / 1e3 / calls;
  };
  time(1);
  const double once = time(1);
  const int calls = std::max(3, std::min(1000, static_cast<int>(0.2 / std::max(once, 1e-6))));
  const double seconds = time(calls);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return seconds;
}

int run(const std::string& filter) {
  if (cuda_device_count() == 0) {
    std::cerr << "grouped_gemm_perf: no CUDA device visible\n";
    return 1;
  }
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    GroupedGemmRunner grouped(stream);
    GemmRunner per_expert(stream);
    for (const PerfCase& c : perf_cases()) {
      if (c.name.find(filter) == std::string::npos) continue;
      const std::vector<int32_t> offsets = test::offsets_of(c.counts);
      const int64_t e = static_cast<int64_t>(c.counts.size()), r = offsets.back(), n = c.expert.n,
                    k = c.expert.k;
      const GroupedGemmShape shape{e, r, n, k};
      DeviceArena arena("grouped GEMM perf tensors");
      auto* offsets_device = static_cast<int32_t*>(arena.allocate_bytes((e + 1) * 4, "offsets"));
      auto* x = static_cast<uint16_t*>(arena.allocate_bytes(r * k * 2, "x"));
      auto* w = static_cast<uint16_t*>(arena.allocate_bytes(e * n * k * 2, "weights"));
      auto* d_out = static_cast<uint16_t*>(arena.allocate_bytes(r * n * 2, "d_out"));
      void* out = arena.allocate_bytes(r * n * 2, "out");
      void* d_x = arena.allocate_bytes(r * k * 2, "d_x");
      auto* d_w = static_cast<float*>(arena.allocate_bytes(e * n * k * 4, "d_w"));
      void* workspace =
          arena.allocate_bytes(static_cast<int64_t>(GroupedGemmRunner::workspace_bytes(e)), "workspace");
      const auto upload = [&](void* device, const std::vector<uint16_t>& host) {
        LOOM_CUDA_CHECK(
            cudaMemcpyAsync(device, host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream));
        LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
      };
      LOOM_CUDA_CHECK(cudaMemcpyAsync(offsets_device, offsets.data(), offsets.size() * 4,
                                      cudaMemcpyHostToDevice, stream));
      upload(x, test::random_bf16_bits(r * k, 1, 1.0f));
      upload(w, test::random_bf16_bits(e * n * k, 2, 1.0f));
      upload(d_out, test::random_bf16_bits(r * n, 3, 1.0f));
      LOOM_CUDA_CHECK(cudaMemsetAsync(d_w, 0, static_cast<size_t>(e * n * k * 4), stream));

      const double seconds[3] = {
          seconds_per_call(stream, [&] { grouped.forward(shape, offsets_device, x, w, out, workspace); }),
          seconds_per_call(stream,
                           [&] { grouped.backward_input(shape, offsets_device, d_out, w, d_x, workspace); }),
          seconds_per_call(stream,
                           [&] { grouped.backward_weight(shape, offsets_device, d_out, x, d_w, workspace); }),
      };
      // The same work one expert at a time (experts with no rows have no GEMM).
      const auto each_expert = [&](const std::function<void(int64_t, int64_t, int64_t)>& gemm) {
        return [&, gemm] {
          for (int64_t i = 0; i < e; ++i) {
            const int64_t begin = offsets[static_cast<size_t>(i)],
                          rows = offsets[static_cast<size_t>(i) + 1] - begin;
            if (rows > 0) gemm(i, begin, rows);
          }
        };
      };
      const double loop_seconds[3] = {
          seconds_per_call(stream, each_expert([&](int64_t i, int64_t begin, int64_t rows) {
                             per_expert.run({rows, n, k, false, true}, x + begin * k, w + i * n * k,
                                            static_cast<uint16_t*>(out) + begin * n);
                           })),
          seconds_per_call(stream, each_expert([&](int64_t i, int64_t begin, int64_t rows) {
                             per_expert.run({rows, k, n, false, false}, d_out + begin * n, w + i * n * k,
                                            static_cast<uint16_t*>(d_x) + begin * k);
                           })),
          seconds_per_call(stream, each_expert([&](int64_t i, int64_t begin, int64_t rows) {
                             per_expert.run({n, k, rows, true, false, DType::f32, true}, d_out + begin * n,
                                            x + begin * k, d_w + i * n * k);
                           })),
      };
      const double flops = 2.0 * static_cast<double>(r) * static_cast<double>(n) * static_cast<double>(k);
      const auto tflops = [&](double s) { return flops / s / 1e12; };
      std::printf(
          "{\"case\": \"%s\", \"experts\": %lld, \"rows\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"min_expert_rows\": %d, \"max_expert_rows\": %d, \"flops_per_call\": %.9g, "
          "\"forward_tflops\": %.6g, \"backward_input_tflops\": %.6g, \"backward_weight_tflops\": %.6g, "
          "\"cublaslt_loop_forward_tflops\": %.6g, \"cublaslt_loop_backward_input_tflops\": %.6g, "
          "\"cublaslt_loop_backward_weight_tflops\": %.6g}\n",
          c.name.c_str(), static_cast<long long>(e), static_cast<long long>(r), static_cast<long long>(n),
          static_cast<long long>(k), *std::min_element(c.counts.begin(), c.counts.end()),
          *std::max_element(c.counts.begin(), c.counts.end()), flops, tflops(seconds[0]), tflops(seconds[1]),
          tflops(seconds[2]), tflops(loop_seconds[0]), tflops(loop_seconds[1]), tflops(loop_seconds[2]));
      std::fflush(stdout);
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::run(argc > 1 ? argv[1] : "");
}
