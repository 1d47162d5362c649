#include "io/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "core/json_strict.h"
#include "core/parallel.h"
#include "io/file_output.h"
#include "io/hf_checkpoint.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// PEFT options that change what the adapters compute, and the value that leaves them off.
bool left_off(const json& config, const char* key) {
  if (!config.contains(key) || config.at(key).is_null()) return true;
  const json& v = config.at(key);
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_string()) return v.get<std::string>() == "none";
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

class LoraMergedSource final : public ParamSource {
 public:
  LoraMergedSource(const ModelConfig& config, const ParamTable& base_table, ParamSource& base,
                   const LoraConfig& lora, const ParamTable& adapters, const std::vector<float>& values)
      : base_(base), scale_(lora.scale()) {
    LOOM_ASSERT(static_cast<int64_t>(values.size()) == adapters.total_numel,
                "adapter values of another table");
    for (const ParamSpec& layer : base_table.params) {
      const ParamKind k = layer.kind;
      if (k != ParamKind::qkv && k != ParamKind::o_proj && k != ParamKind::gate_up && k != ParamKind::down)
        continue;
      int64_t j = 0;  // the target's place among the layer's stacked A's
      for (LoraTarget t : lora_layer_targets(k)) {
        if (!lora.targets_module(t)) continue;
        const ParamSpec& a =
            adapters.params[static_cast<size_t>(adapters.find(lora_a_kind(layer.kind), layer.layer))];
        const ParamSpec& b = adapters.params[static_cast<size_t>(adapters.find(lora_b_kind(t), layer.layer))];
        const int64_t cols = layer.shape[1], row0 = lora_target_row(config, t);
        updates_.push_back({layer.offset + row0 * cols, lora_target_rows(config, t), cols, lora.rank,
                            values.data() + a.offset + j * lora.rank * cols, values.data() + b.offset});
        ++j;
      }
    }
  }

  void read(int64_t begin, int64_t count, float* dst) override {
    base_.read(begin, count, dst);
    for (const Update& u : updates_) {
      const int64_t first = std::max(begin, u.offset),
                    last = std::min(begin + count, u.offset + u.rows * u.cols);
      if (first >= last) continue;
      // Row by row over the overlap: delta[n][k] = Σ_r B[n][r] · A[r][k], then · scale.
      parallel_for((last - 1) / u.cols - (first - u.offset) / u.cols + 1, 16, [&](int64_t b, int64_t e) {
        for (int64_t n = (first - u.offset) / u.cols + b; n < (first - u.offset) / u.cols + e; ++n) {
          const int64_t k0 = std::max<int64_t>(0, first - u.offset - n * u.cols);
          const int64_t k1 = std::min<int64_t>(u.cols, last - u.offset - n * u.cols);
          for (int64_t k = k0; k < k1; ++k) {
            float delta = 0;
            for (int64_t r = 0; r < u.rank; ++r) delta += u.b[n * u.rank + r] * u.a[r * u.cols + k];
            dst[u.offset + n * u.cols + k - begin] += delta * scale_;
          }
        }
      });
    }
  }

 private:
  // One target's rows of a fused weight: flat [offset, offset + rows · cols), its B [rows, rank]
  // and A [rank, cols].
  struct Update {
    int64_t offset, rows, cols, rank;
    const float* a;
    const float* b;
  };
  ParamSource& base_;
  float scale_;
  std::vector<Update> updates_;
};

}  // namespace

PeftAdapterConfig peft_adapter_read_config(const std::string& dir) {
  const std::string path = join(dir, kConfigFile);
  const json config = json_read_file_strict(path);
  if (!config.is_object()) throw_input_error(path, "expected a JSON object");
  const auto field = [&](const char* key) -> const json& {
    if (!config.contains(key)) throw_input_error(path, std::string(key) + ": missing");
    return config.at(key);
  };
  const auto fail = [&](const char* key, const std::string& expected) {
    throw_input_error(path, std::string(key) + ": found " + config.at(key).dump() + ", expected " + expected);
  };
  if (field("peft_type") != "LORA") fail("peft_type", "\"LORA\"");
  if (config.contains("task_type") && !config.at("task_type").is_null() &&
      config.at("task_type") != "CAUSAL_LM")
    fail("task_type", "\"CAUSAL_LM\"");
  PeftAdapterConfig out;
  const json& r = field("r");
  if (!r.is_number_integer() || r.get<int64_t>() < 1) fail("r", "an integer >= 1");
  out.lora.rank = r.get<int64_t>();
  const json& alpha = field("lora_alpha");
  if (!alpha.is_number() || !std::isfinite(alpha.get<double>())) fail("lora_alpha", "a finite number");
  out.lora.alpha = alpha.get<double>();
  const json& targets = field("target_modules");
  if (!targets.is_array() || targets.empty())
    fail("target_modules", "a list of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  for (const json& t : targets) {
    LoraTarget target{};
    if (!t.is_string() || !lora_target_parse(t.get<std::string>(), &target))
      fail("target_modules", "names among q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
    out.lora.targets[static_cast<size_t>(target)] = true;
  }
  if (config.contains("lora_dropout")) {
    const json& d = config.at("lora_dropout");
    if (!d.is_number() || !(d.get<double>() >= 0 && d.get<double>() < 1))
      fail("lora_dropout", "a number in [0, 1)");
    out.dropout = d.get<double>();
  }
  if (config.contains("use_rslora") && !config.at("use_rslora").is_null()) {
    if (!config.at("use_rslora").is_boolean()) fail("use_rslora", "true or false");
    out.lora.rslora = config.at("use_rslora").get<bool>();
  }
  for (const char* key : {"use_dora", "bias", "modules_to_save", "layers_to_transform", "rank_pattern",
                          "alpha_pattern", "fan_in_fan_out"})
    if (!left_off(config, key)) fail(key, "null, false, \"none\" or empty (loom trains plain LoRA)");
  if (config.contains("base_model_name_or_path") && config.at("base_model_name_or_path").is_string())
    out.base_model = config.at("base_model_name_or_path").get<std::string>();
  return out;
}

std::unique_ptr<ParamSource> peft_adapter_open(const std::string& dir, const ParamTable& adapters) {
  return hf_tensors_open(join(dir, kWeightsFile), adapters);
}

void peft_adapter_save(const std::string& dir_arg, const LoraConfig& lora, const std::string& base_model,
                       const ParamTable& adapters, ParamSource& values, DType storage) {
  std::string dir = dir_arg;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!ec) fs::create_directories(tmp, ec);
  if (ec) throw_runtime_failure(tmp, "cannot create folder: " + ec.message());
  json targets = json::array();
  for (int i = 0; i < kLoraTargets; ++i)
    if (lora.targets[static_cast<size_t>(i)])
      targets.push_back(lora_target_module(static_cast<LoraTarget>(i)));
  const json config = {{"peft_type", "LORA"},
                       {"task_type", "CAUSAL_LM"},
                       {"r", lora.rank},
                       {"lora_alpha", lora.alpha},
                       {"target_modules", targets},
                       {"lora_dropout", lora.dropout},
                       {"use_rslora", lora.rslora},
                       {"bias", "none"},
                       {"fan_in_fan_out", false},
                       {"init_lora_weights", true},
                       {"inference_mode", true},
                       {"modules_to_save", nullptr},
                       {"base_model_name_or_path", base_model.empty() ? json(nullptr) : json(base_model)}};
  file_write_atomic(join(tmp, kConfigFile), config.dump(2) + "\n");
  hf_tensors_save(join(tmp, kWeightsFile), adapters, values, storage);
  fs::remove_all(dir, ec);
  if (ec) throw_runtime_failure(dir, "cannot remove the previous adapter folder: " + ec.message());
  fs::rename(tmp, dir, ec);
  if (ec) throw_runtime_failure(dir, "cannot rename " + tmp + " into place: " + ec.message());
  const fs::path parent = fs::path(dir).parent_path();
  file_sync_dir(parent.empty() ? "." : parent.string());
}

std::unique_ptr<ParamSource> lora_merged_source(const ModelConfig& config, const ParamTable& base_table,
                                                ParamSource& base, const LoraConfig& lora,
                                                const ParamTable& adapters,
                                                const std::vector<float>& adapter_values) {
  return std::make_unique<LoraMergedSource>(config, base_table, base, lora, adapters, adapter_values);
}

}  // namespace loom
