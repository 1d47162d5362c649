#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace loom {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i16: return 2;
    case DType::u8: return 1;
    case DType::i64: return 8;
    case DType::f64: return 8;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
  }
  return 0;
}

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i16: return "I16";
    case DType::u8: return "U8";
    case DType::i64: return "I64";
    case DType::f64: return "F64";
    case DType::e4m3: return "F8_E4M3";
    case DType::e5m2: return "F8_E5M2";
  }
  return "?";
}

bool dtype_from_name(const std::string& name, DType* dtype) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F32", DType::f32}, {"BF16", DType::bf16}, {"I32", DType::i32}, {"I16", DType::i16},
      {"U8", DType::u8},   {"I64", DType::i64},   {"F64", DType::f64},
      {"F8_E4M3", DType::e4m3}, {"F8_E5M2", DType::e5m2}};
  for (const auto& [n, d] : kNames) {
    if (name == n) {
      *dtype = d;
      return true;
    }
  }
  return false;
}

Shape::Shape(std::initializer_list<int64_t> list) {
  LOOM_ASSERT(list.size() <= kMaxDims, "too many dims");
  for (int64_t d : list) dims[static_cast<size_t>(ndim++)] = d;
}

Shape::Shape(const std::vector<int64_t>& list) {
  LOOM_ASSERT(list.size() <= kMaxDims, "too many dims");
  for (int64_t d : list) dims[static_cast<size_t>(ndim++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& other) const {
  return ndim == other.ndim && std::equal(dims.begin(), dims.begin() + ndim, other.dims.begin());
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<size_t>(i)]);
  }
  return s + "]";
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  LOOM_ASSERT(shape.ndim >= 1 && begin >= 0 && begin + count <= shape[0], "row range out of bounds");
  int64_t row_elems = shape[0] ? numel() / shape[0] : 0;
  Tensor out = *this;
  out.data = static_cast<uint8_t*>(data) + static_cast<size_t>(begin * row_elems) * dtype_size(dtype);
  out.shape.dims[0] = count;
  return out;
}

Tensor Tensor::reshaped(Shape new_shape) const {
  LOOM_ASSERT(new_shape.numel() == numel(), "reshape changes element count");
  Tensor out = *this;
  out.shape = new_shape;
  return out;
}

void check_tensor(const char* op, const char* name, const Tensor& t, DType dtype,
                  std::initializer_list<int64_t> expected) {
  bool ok = t.dtype == dtype && t.shape.ndim == static_cast<int>(expected.size());
  int i = 0;
  for (int64_t d : expected) {
    if (ok && d >= 0 && t.shape[i] != d) ok = false;
    ++i;
  }
  if (!ok) {
    std::string want = "[";
    i = 0;
    for (int64_t d : expected) want += (i++ ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
    want += "]";
    throw_runtime_failure(std::string(op),
                          std::string("tensor ") + name + " is " + dtype_name(t.dtype) + t.shape.str() +
                              ", expected " + dtype_name(dtype) + want);
  }
}

HostBuffer::HostBuffer(Shape shape, DType dtype)
    : bytes_(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), shape_(shape), dtype_(dtype) {}

void HostBuffer::zero() { std::fill(bytes_.begin(), bytes_.end(), uint8_t{0}); }

}  // namespace loom
