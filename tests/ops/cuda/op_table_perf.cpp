// The op table's perf mode: each case the CUDA backend takes (op_table.h), timed on the GPU,
// one JSON line a case on stdout: its TFLOP/s where it counts FLOPs (GEMMs, attention), else
// its GB/s (bytes read and written, op_case_bytes). A case's setup (the FP8 casts before an
// FP8 GEMM or a census) runs once, untimed; one forward + backward warms it up (GEMM
// algorithm choice, workspaces), then as many as fill about 0.2 s are timed together.
//
//   op_table_perf [substring]   only the cases whose name contains it
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/op_table_cuda.h"
#include "ops/op_table.h"

namespace loom {
namespace {

// The seconds `calls` forwards + backwards of `c` take, from the first launch to the device idle.
double time_calls(CudaOps& ops, const test::OpCase& c, const test::Args& args, int calls) {
  const auto begin = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    c.forward(ops, args);
    if (c.backward) c.backward(ops, args);
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(ops.stream()));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

std::string json_list(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", \"" : "\"") + names[i] + "\"";
  return s + "]";
}

int run(const std::string& filter) {
  if (cuda_device_count() == 0) {
    std::cerr << "op_table_perf: no CUDA device visible\n";
    return 1;
  }
  CudaOps ops(/*loss_chunk_tokens=*/48);  // test_cuda_ops' chunks: the same cases' paths
  for (const test::OpCase& c : test::op_table()) {
    if (!c.cuda || c.name.find(filter) == std::string::npos) continue;
    DeviceArena arena("op table perf");
    const test::HostArgs start = test::op_case_values(c, 1234);
    test::HostArgs host;
    const test::Args args = test::device_tensors(c, start, arena, host);
    if (c.setup) c.setup(ops, args);
    time_calls(ops, c, args, 1);
    const double once = time_calls(ops, c, args, 1);
    const int calls = std::max(3, std::min(1000, static_cast<int>(0.2 / std::max(once, 1e-6))));
    const double seconds = time_calls(ops, c, args, calls) / calls;
    const double bytes = test::op_case_bytes(c);
    std::printf("{\"case\": \"%s\", \"ops\": %s, \"seconds\": %.9g, \"flops\": %.9g, \"bytes\": %.9g, ",
                c.name.c_str(), json_list(c.ops).c_str(), seconds, c.flops, bytes);
    if (c.flops > 0)
      std::printf("\"tflops\": %.6g}\n", c.flops / seconds / 1e12);
    else
      std::printf("\"gb_per_s\": %.6g}\n", bytes / seconds / 1e9);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::run(argc > 1 ? argv[1] : "");
}
