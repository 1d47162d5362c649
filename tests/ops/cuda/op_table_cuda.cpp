#include "ops/cuda/op_table_cuda.h"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_check.h"

namespace loom::test {

Args device_tensors(const OpCase& c, const HostArgs& start, DeviceArena& arena, HostArgs& host) {
  Args args;
  for (const Arg& arg : c.args) {
    const HostArg& v = start.at(arg.name);
    if (arg.kind == Kind::host) {
      host[arg.name] = v;
      args[arg.name] = Tensor{host[arg.name].values.data(), arg.shape, DType::f32, Device::cpu};
      continue;
    }
    const Tensor t = arena.allocate(arg.shape, kind_dtype(arg.kind, DType::bf16), "op case argument");
    std::vector<uint16_t> bits;
    const void* from = v.bytes.data();
    if (arg.kind == Kind::ids) {
      from = v.ids.data();
    } else if (arg.kind == Kind::activation) {
      for (float x : v.values) bits.push_back(float_to_bf16(x).bits);
      from = bits.data();
    } else if (arg.kind == Kind::f32) {
      from = v.values.data();
    }
    LOOM_CUDA_CHECK(cudaMemcpy(t.data, from, t.nbytes(), cudaMemcpyHostToDevice));
    args[arg.name] = t;
  }
  // A host-to-device cudaMemcpy runs on the legacy stream, which the ops' non-blocking stream
  // does not wait for, and may return before its data lands.
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  return args;
}

HostArg download(const Arg& arg, const Tensor& t) {
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  HostArg v;
  const size_t n = static_cast<size_t>(t.numel());
  switch (arg.kind) {
    case Kind::host: v.values.assign(t.as<float>(), t.as<float>() + n); break;
    case Kind::ids:
      v.ids.resize(n);
      LOOM_CUDA_CHECK(cudaMemcpy(v.ids.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
      break;
    case Kind::f32:
      v.values.resize(n);
      LOOM_CUDA_CHECK(cudaMemcpy(v.values.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
      break;
    case Kind::activation: {
      std::vector<uint16_t> bits(n);
      LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
      for (uint16_t b : bits) v.values.push_back(bf16_to_float(bf16{b}));
      break;
    }
    case Kind::e4m3:
    case Kind::e5m2:
    case Kind::i64:
      v.bytes.resize(t.nbytes());
      LOOM_CUDA_CHECK(cudaMemcpy(v.bytes.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
      break;
  }
  return v;
}

}  // namespace loom::test
