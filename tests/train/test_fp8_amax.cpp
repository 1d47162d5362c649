// Tensor-scaled FP8 layers cast their operands with an amax that the op producing the operand
// wrote beside it (the norms, SwiGLU, the q/k norm + RoPE backward: ops.h out_amax), or with
// one a pass of their own took. Whichever, a cast must see the amax of the very tensor it
// casts: an amax read from the wrong slot, written by another op or left from an earlier
// layer would scale the tensor wrongly and still train, a little worse. Here a CpuOps checks
// every cast's amax against its own pass over the tensor, through a forward and backward of
// each tiny model under every recompute policy.
#include <gtest/gtest.h>

#include <string>

#include "core/allocator.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel_train_util.h"

namespace loom {
namespace {

class AmaxCheckingOps : public CpuOps {
 public:
  void fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) override {
    float own = 0;
    CpuOps::amax(Tensor{&own, {1}, DType::f32, Device::cpu}, x);
    ++casts;
    if (amax.as<float>()[0] != own) ++wrong;
    CpuOps::fp8_cast(out, out_t, scale_inv, x, amax, format);
  }
  int casts = 0, wrong = 0;
};

struct Policy {
  std::string name;
  RecomputePolicy recompute;
};

class Fp8CastAmax : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8CastAmax, EveryCastSeesTheAmaxOfTheTensorItCasts) {
  const Model m = tiny(GetParam());
  const Layout one{"one rank", {1, 1, 1, 1}, false, {}};
  const int64_t layers = m.config.num_hidden_layers;
  for (const Policy& p :
       {Policy{"no recompute", {}}, Policy{"selective", {RecomputePolicy::Granularity::selective}},
        Policy{"full, a layer a chunk", {RecomputePolicy::Granularity::full, false, 1}},
        Policy{"full, two layers a chunk", {RecomputePolicy::Granularity::full, false, 2}},
        Policy{"full, the first layer", {RecomputePolicy::Granularity::full, true, 1}}}) {
    SCOPED_TRACE(p.name);
    AmaxCheckingOps ops;
    run_in_process(1, [&](Comm& world) {
      Groups g = groups_create(world, one.layout, kTimeout);
      RankWeights w = rank_weights(m, one, g.coords);
      DecoderModel model(m.config, w.shard.table, ops, p.recompute, w.shard.model, nullptr);
      HostArena weight_cache, scratch;
      LinearPrecision fp8;
      fp8.fp8 = true;
      model.set_linear_precision(fp8, &weight_cache);
      MicroBatchData batch = micro_batch_build(m.rows, {0, 1});
      model.forward_backward(w.tensors(), batch.view(), scratch, 1.0f);
    });
    // Each layer casts its 4 inputs, 4 weights and 4 output gradients at least once.
    EXPECT_GE(ops.casts, 12 * layers);
    EXPECT_EQ(ops.wrong, 0) << "of " << ops.casts << " casts";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, Fp8CastAmax, ::testing::Values("tiny_untied", "tiny_llama", "tiny_qwen2"));

}  // namespace
}  // namespace loom
