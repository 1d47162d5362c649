// Hugging Face checkpoint folders: config.json plus the weights, either one
// model.safetensors or shards model-00001-of-0000N.safetensors listed by
// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {tensor:
// shard file}}), as transformers' save_pretrained writes them.
//
// The parameters live in loom's flat fp32 buffer of ParamTable::total_numel floats
// (model/param_table.h): each ParamSpec at its offset, row-major; each HF tensor is rows
// [row_offset, row_offset + shape[0]) of its param. Loading and saving are copies of those
// row ranges, with a dtype conversion.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "io/param_source.h"
#include "model/config.h"
#include "model/param_table.h"

namespace loom {

// The model's architecture from dir/config.json (model_config_load).
ModelConfig hf_checkpoint_read_config(const std::string& dir);

// The weights of the checkpoint in `dir` as a source of flat ranges (io/param_source.h):
// model.safetensors when present (transformers prefers it too), else
// model.safetensors.index.json and its shards. Stored F32, BF16 and F64 tensors are converted
// to fp32 (BF16 exactly). Every tensor is validated here, before any value is read; each of
// these is an InputError naming the file and the
// tensor: a tensor of the table missing; a tensor not in the table; a shape other than the
// config's ("expected [128, 64] from config.json, found [64, 64]"); a dtype that is not a
// float type; an index naming a shard that does not exist or a tensor its shard lacks.
// A tied model's checkpoint may hold lm_head.weight (transformers omits it): it is accepted
// only if it equals model.embed_tokens.weight element for element. The source keeps the
// files mapped; a range reads only the bytes of the tensors it crosses. `table` must outlive
// the source.
std::unique_ptr<ParamSource> hf_checkpoint_open_params(const std::string& dir, const ModelConfig& config,
                                                       const ParamTable& table);
// Fills params[0, table.total_numel) from the checkpoint in `dir` (the whole range of
// hf_checkpoint_open_params's source).
void hf_checkpoint_load_params(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                               float* params);

// One safetensors file holding exactly the tensors of `table` (by their hf_name and shape, any
// float dtype), as a source laid out by the table: PEFT's adapter_model.safetensors. Each
// mismatch is an InputError naming the file and the tensor. `table` must outlive the source.
std::unique_ptr<ParamSource> hf_tensors_open(const std::string& path, const ParamTable& table);
// Writes `path` (atomically) with the tensors of `table` in table order, stored as `storage`
// (f32 or bf16), their values read from `params` a piece at a time.
void hf_tensors_save(const std::string& path, const ParamTable& table, ParamSource& params, DType storage);

// Writes the checkpoint folder `dir` loadable by transformers: config.json
// (model_config_to_json, dtype "float32" or "bfloat16" per `storage`) and the weights stored
// as `storage` (DType::f32, or DType::bf16 rounded to nearest even), in table order, with
// "__metadata__": {"format": "pt"}. A tied model has no lm_head.weight. max_shard_bytes = 0
// writes one model.safetensors; otherwise tensors fill shards in order, a shard taking the
// next tensor while it stays within max_shard_bytes (a larger tensor gets a shard alone), and
// more than one shard are named model-0000i-of-0000N.safetensors with an index. The folder
// is written as `dir + ".tmp"` (removed first if present), then renamed to `dir`, replacing
// an existing one. I/O failures throw RuntimeFailure. The values are read from `params`
// tensor by tensor in table order, in pieces of at most kSafetensorsPieceNumel (io/safetensors.h)
// elements, so the caller needs no array of all of them.
void hf_checkpoint_save(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                        ParamSource& params, DType storage, int64_t max_shard_bytes);
// The same from params[0, table.total_numel).
void hf_checkpoint_save(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                        const float* params, DType storage, int64_t max_shard_bytes);

}  // namespace loom
