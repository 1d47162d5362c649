#include "parallel/comm.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

Comm::Comm(std::string name, int rank, std::vector<int> world_ranks)
    : name_(std::move(name)), rank_(rank), world_ranks_(std::move(world_ranks)) {
  LOOM_ASSERT(rank_ >= 0 && rank_ < size(), "comm rank outside the group");
}

int Comm::world_rank_of(int group_rank) const {
  LOOM_ASSERT(group_rank >= 0 && group_rank < size(), "group rank outside the group");
  return world_ranks_[static_cast<size_t>(group_rank)];
}

void Comm::send(const void* data, size_t count, DType dtype, int peer, CommTimeout timeout) {
  P2POp op{P2POp::Kind::send, const_cast<void*>(data), count, dtype, peer};
  exchange(std::span<const P2POp>(&op, 1), timeout);
}

void Comm::recv(void* data, size_t count, DType dtype, int peer, CommTimeout timeout) {
  P2POp op{P2POp::Kind::recv, data, count, dtype, peer};
  exchange(std::span<const P2POp>(&op, 1), timeout);
}

std::string Comm::describe() const {
  std::string ranks;
  for (size_t i = 0; i < world_ranks_.size(); ++i) ranks += (i ? ", " : "") + std::to_string(world_ranks_[i]);
  return "group '" + name_ + "' (world ranks [" + ranks + "]) rank " + std::to_string(rank_);
}

std::string Comm::describe_peer(int group_rank) const {
  return "rank " + std::to_string(group_rank) + " (world rank " + std::to_string(world_rank_of(group_rank)) +
         ")";
}

void Comm::check_dtype(DType dtype, const char* op) const {
  bool ok = dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::i32 || dtype == DType::f64;
  LOOM_ASSERT(ok, std::string(op) + " on " + describe() + ": dtype " + dtype_name(dtype) +
                      " is not one of F32, BF16, I32, F64");
}

void Comm::check_peer(int peer, const char* op) const {
  LOOM_ASSERT(peer >= 0 && peer < size(), std::string(op) + " on " + describe() + ": peer " +
                                              std::to_string(peer) + " outside the group");
}

void Comm::check_split_members(const std::vector<int>& members) const {
  if (members.empty()) return;
  bool ascending = std::is_sorted(members.begin(), members.end()) &&
                   std::adjacent_find(members.begin(), members.end()) == members.end();
  bool in_range = members.front() >= 0 && members.back() < size();
  bool has_self = std::find(members.begin(), members.end(), rank_) != members.end();
  LOOM_ASSERT(ascending && in_range && has_self,
              "split on " + describe() +
                  ": members must be distinct ranks of the group, ascending, "
                  "including this rank");
}

size_t comm_bytes(size_t count, DType dtype) {
  return count * dtype_size(dtype);
}

}  // namespace loom
