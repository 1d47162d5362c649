// PEFT's LoRA adapter folder, as `PeftModel.save_pretrained` writes it and
// `PeftModel.from_pretrained` reads it: adapter_config.json and adapter_model.safetensors, the
// adapters' tensors by PEFT's names (model/lora.h lora_table_build). loom reads one to start
// from (train.lora.init.adapter) and writes one as a LoRA run's final/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/param_source.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/param_table.h"

namespace loom {

// adapter_config.json's fields loom reads.
struct PeftAdapterConfig {
  LoraConfig lora;  // r, lora_alpha, target_modules, use_rslora
  double dropout = 0;
  std::string base_model;  // base_model_name_or_path ("" where null)
};

// dir/adapter_config.json: peft_type "LORA", task_type "CAUSAL_LM" (or absent), r ≥ 1, a
// finite lora_alpha, target_modules a list of the seven module names, lora_dropout in [0, 1),
// use_rslora a bool (absent: false); what loom cannot train as PEFT would (use_dora, a bias
// other than "none", modules_to_save, layers_to_transform, rank_pattern or alpha_pattern
// entries, fan_in_fan_out) refused. Each is an InputError naming the file and the field.
PeftAdapterConfig peft_adapter_read_config(const std::string& dir);

// The adapters of dir/adapter_model.safetensors as a source laid out by `adapters` (every
// tensor there, of its shape; none else). `adapters` must outlive the source.
std::unique_ptr<ParamSource> peft_adapter_open(const std::string& dir, const ParamTable& adapters);

// Writes the folder `dir` (as dir + ".tmp", renamed into place, replacing one there):
// adapter_config.json for `lora` over `base_model` and adapter_model.safetensors of `values`
// (laid out by `adapters`) stored as `storage` (f32 or bf16).
void peft_adapter_save(const std::string& dir, const LoraConfig& lora, const std::string& base_model,
                       const ParamTable& adapters, ParamSource& values, DType storage);

// The base with the adapters merged into it, as PEFT's merge_and_unload computes it: each
// targeted module's rows of its fused weight W + scale · B·A (in fp32), every other element
// the base's. Laid out by `base_table`; `adapter_values` is laid out by `adapters`. The
// arguments must outlive the source.
std::unique_ptr<ParamSource> lora_merged_source(const ModelConfig& config, const ParamTable& base_table,
                                                ParamSource& base, const LoraConfig& lora,
                                                const ParamTable& adapters,
                                                const std::vector<float>& adapter_values);

}  // namespace loom
