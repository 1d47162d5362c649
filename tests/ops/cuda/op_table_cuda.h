// The op table's cases on the GPU: their arguments uploaded and downloaded, for the GPU-vs-CPU
// comparison (test_cuda_ops) and the perf mode (op_table_perf).
#pragma once

#include "ops/cuda/device_arena.h"
#include "ops/op_table.h"

namespace loom::test {

// The case's arguments on the GPU from their starting values `start`, in their CUDA dtypes
// (activations bf16), allocated from `arena`; the host ones (Kind::host) in `host`, which
// must outlive them. Returns once the uploads have landed.
Args device_tensors(const OpCase& c, const HostArgs& start, DeviceArena& arena, HostArgs& host);
// An argument's values back on the host (bf16 widened to fp32), once the device is idle.
HostArg download(const Arg& arg, const Tensor& t);

}  // namespace loom::test
