// The optimizer step's time at offload fractions 0, 0.5 and 1, copies overlapped and in turn
// (docs/offload.md), on one GPU: CudaAdamW over N parameters as one decayed tensor, the step
// timed from its call to the end of the stream's work (so the last copies up are in it).
// Prints one JSON object per configuration on stdout.
//
//   bench_offload [N=1000000000] [STEPS=5]
//
// Memory: GPU 6 bytes a parameter (bf16 weights, fp32 grads) + 10 on the GPU share; host
// 12 bytes pinned on the offloaded share, plus 12 while loading.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/version.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "optim/cuda_adamw.h"

namespace loom {
namespace {

int run(int64_t n, int steps) {
  std::printf("{\"loom\": \"%s\", \"device\": \"%s\", \"parameters\": %lld, \"threads\": %d}\n",
              loom_version().c_str(), cuda_device_description(0).c_str(), static_cast<long long>(n),
              worker_count());
  DeviceArena arena("bench");
  auto* bits = static_cast<uint16_t*>(arena.allocate_bytes(n * 2, "bf16 weights"));
  auto* grads = static_cast<float*>(arena.allocate_bytes(n * 4, "grads"));
  LOOM_CUDA_CHECK(cudaMemset(grads, 0, static_cast<size_t>(n) * 4));
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<float> master(static_cast<size_t>(n), 0.02f);
  const AdamWConfig cfg;
  struct Config {
    double fraction;
    bool overlap;
  };
  for (const Config c :
       {Config{0.0, true}, Config{0.5, true}, Config{0.5, false}, Config{1.0, true}, Config{1.0, false}}) {
    CudaAdamWOptions options;
    options.offload_fraction = c.fraction;
    options.overlap = c.overlap;
    CudaAdamW adam({{0, n, true}}, n, bits, grads, stream, options);
    adam.load(master.data(), nullptr, nullptr);
    std::vector<double> ms;
    for (int s = 1; s <= steps + 1; ++s) {  // step 1 is a warm-up
      const auto t0 = std::chrono::steady_clock::now();
      adam.step(cfg, 1e-5f, s);
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
      const double t =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s > 1) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf(
        "{\"offload_fraction\": %.2f, \"overlap\": %s, \"offloaded\": %lld, \"pinned_bytes\": %lld, "
        "\"step_ms_median\": %.2f, \"step_ms_min\": %.2f, \"step_ms_max\": %.2f}\n",
        c.fraction, c.overlap ? "true" : "false", static_cast<long long>(adam.plan().cpu_numel),
        static_cast<long long>(adam.host_bytes()), ms[ms.size() / 2], ms.front(), ms.back());
    std::fflush(stdout);
  }
  LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1000000000;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (n <= 0 || steps <= 0) {
    std::fprintf(stderr, "usage: bench_offload [N > 0] [STEPS > 0]\n");
    return 2;
  }
  try {
    return loom::run(n, steps);
  } catch (const loom::LoomError& e) {
    std::fprintf(stderr, "bench_offload: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
