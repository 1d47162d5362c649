#include "optim/cuda_adamw.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

// Elements per kernel block: 64 Ki keep a block busy for ~10 µs.
constexpr int64_t kAdamChunk = 1 << 16;

}  // namespace

std::vector<cuda::AdamChunk> cuda_adam_chunks(const std::vector<ParamRange>& ranges) {
  std::vector<cuda::AdamChunk> chunks;
  for (const ParamRange& r : ranges)
    for (int64_t begin = 0; begin < r.numel; begin += kAdamChunk)
      chunks.push_back({r.offset + begin, std::min(kAdamChunk, r.numel - begin), r.decay ? 1 : 0});
  return chunks;
}

cuda::AdamScalars cuda_adam_scalars(const AdamWConfig& cfg, float lr, int64_t step) {
  const AdamWStepScalars s = adamw_step_scalars(cfg, lr, step);
  return {
      s.beta1, s.one_minus_beta1, s.beta2, s.one_minus_beta2, s.bias_correction1, s.bias_correction2, s.eps,
      s.lr,    cfg.weight_decay};
}

// The offloaded share's host memory, one block carved into the state and the slots;
// cudaHostAlloc'd (page-locked), so the copy engines read and write it directly and
// cudaMemcpyAsync is truly asynchronous.
struct CudaAdamW::Pinned {
  void* data = nullptr;
  explicit Pinned(int64_t bytes) {
    const cudaError_t status = cudaHostAlloc(&data, static_cast<size_t>(bytes), cudaHostAllocDefault);
    if (status != cudaSuccess)
      throw_runtime_failure(
          "layout.offload",
          "cannot pin " + std::to_string(bytes) +
              " bytes of host memory for the offloaded optimizer state: " + cudaGetErrorString(status));
  }
  ~Pinned() { cudaFreeHost(data); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

// offload.h's copies on the two copy streams, for one step.
class CudaAdamW::Copies final : public OffloadCopies {
 public:
  explicit Copies(CudaAdamW& o) : o_(o) {}

  void start_grads_down(const OffloadChunk& chunk, float* staging, int slot) override {
    // The grads are final where step() recorded grads_ready_ (before the GPU share's kernel,
    // so that the copies down do not wait for it).
    if (first_) LOOM_CUDA_CHECK(cudaStreamWaitEvent(o_.down_, o_.grads_ready_, 0));
    first_ = false;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(staging, o_.grads_ + chunk.offset, static_cast<size_t>(chunk.numel) * 4,
                                    cudaMemcpyDeviceToHost, o_.down_));
    LOOM_CUDA_CHECK(cudaEventRecord(o_.down_done_[slot], o_.down_));
  }
  void wait_grads_down(int slot) override { LOOM_CUDA_CHECK(cudaEventSynchronize(o_.down_done_[slot])); }
  void start_weights_up(const OffloadChunk& chunk, const uint16_t* bits) override {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(o_.param_bits_ + chunk.offset, bits, static_cast<size_t>(chunk.numel) * 2,
                                    cudaMemcpyHostToDevice, o_.up_));
  }
  void wait_weights_up() override { LOOM_CUDA_CHECK(cudaStreamSynchronize(o_.up_)); }
  // Every copy down was waited for by the host before the last copy up started, so the
  // stream's next work (zeroing the grads, the forward) needs to wait only for the ups.
  void finish() override {
    LOOM_CUDA_CHECK(cudaEventRecord(o_.up_done_, o_.up_));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(o_.stream_, o_.up_done_, 0));
  }

 private:
  CudaAdamW& o_;
  bool first_ = true;
};

CudaAdamW::CudaAdamW(const std::vector<ParamRange>& ranges, int64_t numel, uint16_t* param_bits,
                     const float* grads, cudaStream_t stream, const CudaAdamWOptions& options)
    : plan_(offload_plan(ranges, numel, options.offload_fraction, options.chunk_numel)),
      options_(options),
      param_bits_(param_bits),
      grads_(grads),
      stream_(stream) {
  LOOM_ASSERT(options.piece_numel > 0, "CudaAdamWOptions::piece_numel must be positive");
  const int64_t g = plan_.gpu_numel();
  if (g > 0) {
    remainders_ = static_cast<int16_t*>(arena_.allocate_bytes(g * 2, "master remainders"));
    m_ = static_cast<float*>(arena_.allocate_bytes(g * 4, "Adam first moment"));
    v_ = static_cast<float*>(arena_.allocate_bytes(g * 4, "Adam second moment"));
  }
  const std::vector<cuda::AdamChunk> chunks = cuda_adam_chunks(plan_.gpu_ranges);
  chunk_count_ = static_cast<int64_t>(chunks.size());
  if (chunk_count_ > 0) {
    chunks_ = static_cast<cuda::AdamChunk*>(arena_.allocate_bytes(
        chunk_count_ * static_cast<int64_t>(sizeof(cuda::AdamChunk)), "Adam chunk table"));
    LOOM_CUDA_CHECK(
        cudaMemcpy(chunks_, chunks.data(), chunks.size() * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  }

  const int64_t c = plan_.cpu_numel;
  if (c == 0) return;
  const int64_t slot = std::min(plan_.chunk_numel, c);
  // Layout of the block: m, v and the two slots (4-byte), then the mirror and remainders.
  pinned_ = std::make_unique<Pinned>(c * 12 + 2 * slot * 4);
  auto* f = static_cast<float*>(pinned_->data);
  host_.m = f;
  host_.v = f + c;
  host_.grad_staging[0] = f + 2 * c;
  host_.grad_staging[1] = f + 2 * c + slot;
  host_.param_bits = reinterpret_cast<uint16_t*>(f + 2 * c + 2 * slot);
  host_.remainder = reinterpret_cast<int16_t*>(host_.param_bits + c);
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&grads_ready_, &up_done_})
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  // The host waits on these between chunks: blocking, not spinning, leaves its core to the
  // CPU step's worker threads.
  for (cudaEvent_t* e : {&down_done_[0], &down_done_[1]})
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming | cudaEventBlockingSync));
}

CudaAdamW::~CudaAdamW() {
  // No throwing from a destructor: errors of work still in flight surface elsewhere.
  if (down_) cudaStreamSynchronize(down_);
  if (up_) cudaStreamSynchronize(up_);
  for (cudaEvent_t e : {grads_ready_, up_done_, down_done_[0], down_done_[1]})
    if (e) cudaEventDestroy(e);
  if (down_) cudaStreamDestroy(down_);
  if (up_) cudaStreamDestroy(up_);
}

int64_t CudaAdamW::host_bytes() const {
  const int64_t c = plan_.cpu_numel;
  return c == 0 ? 0 : c * 12 + 2 * std::min(plan_.chunk_numel, c) * 4;
}

void CudaAdamW::synchronize() {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (up_) LOOM_CUDA_CHECK(cudaStreamSynchronize(up_));
  if (down_) LOOM_CUDA_CHECK(cudaStreamSynchronize(down_));
}

void CudaAdamW::step(const AdamWConfig& cfg, float lr, int64_t step, float grad_scale) {
  const cuda::AdamScalars s = cuda_adam_scalars(cfg, lr, step);
  const int64_t c = plan_.cpu_numel;
  if (c > 0) LOOM_CUDA_CHECK(cudaEventRecord(grads_ready_, stream_));
  cuda::adamw_bf16_remainder(param_bits_ + c, remainders_, grads_ + c, m_, v_, chunks_, chunk_count_, s,
                             grad_scale, stream_);
  if (c == 0) return;
  if (!options_.overlap) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // in turn: the GPU share first
  Copies copies(*this);
  offload_step(plan_, host_, copies, cfg, lr, step, options_.overlap, grad_scale);
}

void CudaAdamW::split_masters(const std::function<const float*(int64_t begin, int64_t count)>& piece) {
  const int64_t n = plan_.numel, c = plan_.cpu_numel, g = plan_.gpu_numel(), k = options_.piece_numel;
  // The offloaded share is split straight into its pinned mirror and remainders, the GPU
  // share through staging of one piece: no host array of n elements (an 8B model's weights
  // and remainders would be 33 GB more, on a host that holds its pinned state already).
  for (int64_t begin = 0; begin < c; begin += k) {
    const int64_t count = std::min(k, c - begin);
    master_split_array(piece(begin, count), count, host_.param_bits + begin, host_.remainder + begin);
  }
  if (c > 0)
    LOOM_CUDA_CHECK(
        cudaMemcpy(param_bits_, host_.param_bits, static_cast<size_t>(c) * 2, cudaMemcpyHostToDevice));
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(g, k)));
  std::vector<int16_t> rem(bits.size());
  for (int64_t begin = c; begin < n; begin += k) {
    const int64_t count = std::min(k, n - begin);
    master_split_array(piece(begin, count), count, bits.data(), rem.data());
    // From pageable memory: cudaMemcpy returns once the staging may be reused.
    LOOM_CUDA_CHECK(
        cudaMemcpy(param_bits_ + begin, bits.data(), static_cast<size_t>(count) * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(remainders_ + (begin - c), rem.data(), static_cast<size_t>(count) * 2,
                               cudaMemcpyHostToDevice));
  }
}

void CudaAdamW::load_moments(const CudaRangeRead& m, const CudaRangeRead& v, std::vector<float>& staging) {
  const int64_t n = plan_.numel, c = plan_.cpu_numel, g = plan_.gpu_numel(), k = options_.piece_numel;
  for (auto [read, host, device] : {std::tuple{&m, host_.m, m_}, std::tuple{&v, host_.v, v_}}) {
    if (!*read) {
      if (g > 0) LOOM_CUDA_CHECK(cudaMemset(device, 0, static_cast<size_t>(g) * 4));
      if (c > 0) std::fill(host, host + c, 0.0f);
      continue;
    }
    for (int64_t begin = 0; begin < c; begin += k) (*read)(begin, std::min(k, c - begin), host + begin);
    for (int64_t begin = c; begin < n; begin += k) {
      const int64_t count = std::min(k, n - begin);
      (*read)(begin, count, staging.data());
      // From pageable memory: cudaMemcpy returns once the staging may be reused.
      LOOM_CUDA_CHECK(cudaMemcpy(device + (begin - c), staging.data(), static_cast<size_t>(count) * 4,
                                 cudaMemcpyHostToDevice));
    }
  }
  // cudaMemcpy from pageable memory may return before its DMA lands and cudaMemset is
  // asynchronous; the caller's stream (non-blocking, for the engine) is not ordered after
  // either, so wait here: a load happens once a run and at a resume.
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaAdamW::load(const float* master, const float* m, const float* v) {
  const auto array = [](const float* values) -> CudaRangeRead {
    if (!values) return {};
    return [values](int64_t begin, int64_t count, float* dst) {
      std::memcpy(dst, values + begin, static_cast<size_t>(count) * 4);
    };
  };
  load_pieces(array(master), array(m), array(v));
}

void CudaAdamW::load_pieces(const CudaRangeRead& master, const CudaRangeRead& m, const CudaRangeRead& v) {
  LOOM_ASSERT(static_cast<bool>(master), "CudaAdamW::load_pieces needs the masters");
  synchronize();
  std::vector<float> staging(static_cast<size_t>(std::min(plan_.numel, options_.piece_numel)));
  split_masters([&](int64_t begin, int64_t count) {
    master(begin, count, staging.data());
    return staging.data();
  });
  load_moments(m, v, staging);
}

void CudaAdamW::load_masters(const CudaRangeRead& read) {
  load_pieces(read, {}, {});
}

void CudaAdamW::rebuild_masters(int64_t begin, int64_t count, float* dst) {
  const int64_t c = plan_.cpu_numel, k = options_.piece_numel;
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= plan_.numel, "masters past the end of the buffer");
  // The offloaded share from its pinned mirror (equal to the device's weights after every
  // step) and remainders, the GPU share from the device through staging of one piece (as
  // load, no n-element host arrays).
  const int64_t cpu_end = std::min(begin + count, c);
  if (begin < cpu_end)
    master_rebuild_array(host_.param_bits + begin, host_.remainder + begin, cpu_end - begin, dst);
  const int64_t gpu_begin = std::max(begin, c), end = begin + count;
  if (gpu_begin >= end) return;
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(end - gpu_begin, k)));
  std::vector<int16_t> rem(bits.size());
  for (int64_t at = gpu_begin; at < end; at += k) {
    const int64_t m = std::min(k, end - at);
    LOOM_CUDA_CHECK(
        cudaMemcpy(bits.data(), param_bits_ + at, static_cast<size_t>(m) * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(
        cudaMemcpy(rem.data(), remainders_ + (at - c), static_cast<size_t>(m) * 2, cudaMemcpyDeviceToHost));
    master_rebuild_array(bits.data(), rem.data(), m, dst + (at - begin));
  }
}

void CudaAdamW::save(float* master, float* m, float* v) {
  if (master) save_masters(0, plan_.numel, master);
  save_moments(0, plan_.numel, m, v);
}

void CudaAdamW::save_masters(int64_t begin, int64_t count, float* dst) {
  synchronize();
  rebuild_masters(begin, count, dst);
}

void CudaAdamW::save_moments(int64_t begin, int64_t count, float* m, float* v) {
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= plan_.numel, "moments past the end of the buffer");
  synchronize();
  const int64_t c = plan_.cpu_numel, end = begin + count;
  const int64_t cpu_end = std::min(end, c), gpu_begin = std::max(begin, c);
  // The offloaded share from its pinned state, the GPU share straight from the device
  // (cudaMemcpy into pageable memory returns once the bytes are there).
  for (auto [out, host, device] : {std::tuple{m, host_.m, m_}, std::tuple{v, host_.v, v_}}) {
    if (!out) continue;
    if (begin < cpu_end) std::memcpy(out, host + begin, static_cast<size_t>(cpu_end - begin) * 4);
    if (gpu_begin < end)
      LOOM_CUDA_CHECK(cudaMemcpy(out + (gpu_begin - begin), device + (gpu_begin - c),
                                 static_cast<size_t>(end - gpu_begin) * 4, cudaMemcpyDeviceToHost));
  }
}

}  // namespace loom
