#include "parallel/host_staged_comm.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace loom {
namespace {

bool on_device(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // a host pointer unknown to CUDA: clear the sticky-free error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const std::string& where) {
  if (bytes == 0) return;
  cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
  if (e != cudaSuccess) throw_runtime_failure(where, std::string("cudaMemcpy: ") + cudaGetErrorString(e));
}

// A buffer as the inner Comm sees it: the device one's host copy, or the host one itself.
class Staged {
 public:
  Staged(const void* data, size_t bytes, bool read, const std::string& where)
      : data_(const_cast<void*>(data)), bytes_(bytes), device_(on_device(data)), where_(where) {
    if (!device_) return;
    host_.resize(bytes);
    if (read) copy(host_.data(), data, bytes, cudaMemcpyDeviceToHost, where_);
  }
  void* host() { return device_ ? host_.data() : data_; }
  // The inner call's result back into the device buffer.
  void write_back() {
    if (device_) copy(data_, host_.data(), bytes_, cudaMemcpyHostToDevice, where_);
  }

 private:
  void* data_;
  size_t bytes_;
  bool device_;
  std::string where_;
  std::vector<uint8_t> host_;
};

class HostStagedComm final : public Comm {
 public:
  HostStagedComm(Comm& inner, std::unique_ptr<Comm> owned)
      : Comm(inner.name(), inner.rank(), inner.world_ranks()), inner_(inner), owned_(std::move(owned)) {}

  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override {
    Staged d(data, comm_bytes(count, dtype), true, where("all_reduce"));
    inner_.all_reduce_sum(d.host(), count, dtype, timeout);
    d.write_back();
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override {
    Staged s(send, comm_bytes(recv_count, dtype) * static_cast<size_t>(size()), true,
             where("reduce_scatter"));
    Staged r(recv, comm_bytes(recv_count, dtype), false, where("reduce_scatter"));
    inner_.reduce_scatter_sum(s.host(), r.host(), recv_count, dtype, timeout);
    r.write_back();
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  CommTimeout timeout) override {
    // In place (send inside recv) reads the send part before recv is staged over it.
    Staged s(send, comm_bytes(send_count, dtype), true, where("all_gather"));
    Staged r(recv, comm_bytes(send_count, dtype) * static_cast<size_t>(size()), false, where("all_gather"));
    inner_.all_gather(s.host(), r.host(), send_count, dtype, timeout);
    r.write_back();
  }
  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override {
    Staged d(data, comm_bytes(count, dtype), root == rank(), where("broadcast"));
    inner_.broadcast(d.host(), count, dtype, root, timeout);
    d.write_back();
  }
  void barrier(CommTimeout timeout) override { inner_.barrier(timeout); }
  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override {
    std::vector<Staged> staged;
    staged.reserve(ops.size());
    std::vector<P2POp> host_ops(ops.begin(), ops.end());
    for (P2POp& op : host_ops) {
      staged.emplace_back(op.data, comm_bytes(op.count, op.dtype), op.kind == P2POp::Kind::send,
                          where("exchange"));
      op.data = staged.back().host();
    }
    inner_.exchange(host_ops, timeout);
    for (size_t i = 0; i < host_ops.size(); ++i)
      if (host_ops[i].kind == P2POp::Kind::recv) staged[i].write_back();
  }
  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                              CommTimeout timeout) override {
    std::unique_ptr<Comm> child = inner_.split(members, name, timeout);
    if (!child) return nullptr;
    Comm& ref = *child;
    return std::make_unique<HostStagedComm>(ref, std::move(child));
  }

 private:
  std::string where(const char* op) const { return describe() + ": host-staged " + op; }
  Comm& inner_;
  std::unique_ptr<Comm> owned_;  // the inner group of a split; null for the world
};

}  // namespace

std::unique_ptr<Comm> host_staged_comm_create(Comm& inner) {
  return std::make_unique<HostStagedComm>(inner, nullptr);
}

}  // namespace loom
