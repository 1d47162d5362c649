// A tensor view: pointer, shape, dtype, device. It owns nothing.
//
// Views are row-major and contiguous unless a stride says otherwise; ops validate the
// shapes and dtypes they are given once, at the op boundary, with a message that names
// the tensor (check_tensor). Owning storage is a Buffer (host) or an arena allocation.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom {

enum class Device : uint8_t { cpu, cuda };

constexpr int kMaxDims = 4;

struct Shape {
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list);
  explicit Shape(const std::vector<int64_t>& list);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& other) const;
  std::string str() const;  // "[2, 3]"
  std::vector<int64_t> vec() const { return {dims.begin(), dims.begin() + ndim}; }
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, begin + count) of the first dimension.
  Tensor rows(int64_t begin, int64_t count) const;
  Tensor reshaped(Shape new_shape) const;
};

// Validates a tensor at an op boundary; throws naming op and tensor on mismatch.
// A dim of -1 in `expected` matches any size.
void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> expected);

// Host storage of fp32 values with a tensor view over it; what the CPU path uses for
// weights, grads and activations.
class HostBuffer {
 public:
  HostBuffer() = default;
  explicit HostBuffer(Shape shape, DType dtype = DType::f32);
  Tensor view() const { return Tensor{const_cast<uint8_t*>(bytes_.data()), shape_, dtype_, Device::cpu}; }
  float* f32() { return reinterpret_cast<float*>(bytes_.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(bytes_.data()); }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  void zero();

 private:
  std::vector<uint8_t> bytes_;
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace loom
