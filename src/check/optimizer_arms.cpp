#include <algorithm>
#include <bit>

#include "check/optimizer_arm.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

constexpr int64_t kGrain = 1 << 16;  // elements per thread at least

std::vector<ParamRange> whole(int64_t n, bool decay) {
  return {ParamRange{0, n, decay}};
}

class CpuFp32MasterArm : public OptimizerArm {
 public:
  void init(const float* master, int64_t n) override {
    master_.assign(master, master + n);
    m_.assign(static_cast<size_t>(n), 0.0f);
    v_.assign(static_cast<size_t>(n), 0.0f);
  }
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    adamw_step(cfg, lr, t, whole(size(), decay), master_.data(), grad, m_.data(), v_.data());
  }
  void read_master(float* master) override { std::copy(master_.begin(), master_.end(), master); }

 private:
  int64_t size() const { return static_cast<int64_t>(master_.size()); }
  std::vector<float> master_, m_, v_;
};

// bf16 weight bits + int16 remainders, m and v fp32: what TE's store_param_remainders keeps.
class CpuPrecisionAwareArm : public OptimizerArm {
 public:
  void init(const float* master, int64_t n) override {
    bits_.resize(static_cast<size_t>(n));
    rem_.resize(static_cast<size_t>(n));
    master_split_array(master, n, bits_.data(), rem_.data());
    m_.assign(static_cast<size_t>(n), 0.0f);
    v_.assign(static_cast<size_t>(n), 0.0f);
  }
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    adamw_step_bf16_remainder(cfg, lr, t, whole(size(), decay), bits_.data(), rem_.data(), grad, m_.data(),
                              v_.data());
  }
  void read_master(float* master) override {
    master_rebuild_array(bits_.data(), rem_.data(), size(), master);
  }

 protected:
  int64_t size() const { return static_cast<int64_t>(bits_.size()); }
  std::vector<uint16_t> bits_;
  std::vector<int16_t> rem_;
  std::vector<float> m_, v_;
};

// Negative control: the split rounds to nearest even (core/dtype.h float_to_bf16) while the
// rebuild stays TE's. They differ on exact ties with an even high half, where the remainder is
// −32768 and the rebuild steps the weight down one bf16 ulp.
class RneSplitArm : public CpuPrecisionAwareArm {
 public:
  void init(const float* master, int64_t n) override {
    CpuPrecisionAwareArm::init(master, n);
    scratch_.assign(master, master + n);
    split();
  }
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    master_rebuild_array(bits_.data(), rem_.data(), size(), scratch_.data());
    adamw_step(cfg, lr, t, whole(size(), decay), scratch_.data(), grad, m_.data(), v_.data());
    split();
  }

 private:
  void split() {
    parallel_for(size(), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        bits_[i] = float_to_bf16(scratch_[i]).bits;
        rem_[i] =
            std::bit_cast<int16_t>(static_cast<uint16_t>(std::bit_cast<uint32_t>(scratch_[i]) & 0xffffu));
      }
    });
  }
  std::vector<float> scratch_;  // the masters between rebuild and split
};

// Negative control: the remainders are lost after every step, so the master is the bf16 weight.
class RemaindersDroppedArm : public CpuPrecisionAwareArm {
 public:
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    CpuPrecisionAwareArm::step(cfg, lr, t, decay, grad);
    std::fill(rem_.begin(), rem_.end(), int16_t{0});
  }
};

// Negative control: β2 0.999 (PyTorch's default), or 0.98 where 0.999 is the configured one.
class WrongBeta2Arm : public CpuPrecisionAwareArm {
 public:
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    AdamWConfig wrong = cfg;
    wrong.beta2 = cfg.beta2 == 0.999f ? 0.98f : 0.999f;
    CpuPrecisionAwareArm::step(wrong, lr, t, decay, grad);
  }
};

}  // namespace

OptimizerArmSet optimizer_arms_cpu() {
  OptimizerArmSet set;
  set.device = "CPU";
  set.is_cpu = true;
  set.precision_aware_name = "precision-aware AdamW (CPU, bf16 + int16 remainder)";
  set.precision_aware = [] { return std::make_unique<CpuPrecisionAwareArm>(); };
  set.fp32_master_name = "fp32-master AdamW (CPU)";
  set.fp32_master = [] { return std::make_unique<CpuFp32MasterArm>(); };
  return set;
}

OptimizerArmSet optimizer_arms_for(const std::string& device, bool offload) {
  if (device == "cuda") return optimizer_arms_cuda(offload);
  if (device != "cpu") throw_input_error("--device", "found '" + device + "', expected cpu or cuda");
  if (offload)
    throw_input_error(
        "--offload",
        "the offload moves a GPU optimizer's state to the CPU, and the CPU arms' state is on the CPU "
        "already; expected --device cuda with --offload");
  return optimizer_arms_cpu();
}

std::vector<NegativeControl> optimizer_negative_controls() {
  return {
      {"rne_split", "master split rounds to nearest even instead of TE's ties-away split",
       OptimizerCriterion::bitwise_masters, [] { return std::make_unique<RneSplitArm>(); }},
      {"remainders_dropped", "int16 remainders dropped: the master is the bf16 weight",
       OptimizerCriterion::step1_bound, [] { return std::make_unique<RemaindersDroppedArm>(); }},
      {"wrong_beta2", "beta2 0.999 instead of the configured value (0.98 if 0.999 is configured)",
       OptimizerCriterion::step3_bound, [] { return std::make_unique<WrongBeta2Arm>(); }},
  };
}

}  // namespace loom
