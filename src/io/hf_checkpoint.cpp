#include "io/hf_checkpoint.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/json_strict.h"
#include "core/parallel.h"
#include "io/file_output.h"
#include "io/safetensors.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kEmbedding = "model.embed_tokens.weight";
constexpr const char* kLmHead = "lm_head.weight";
// Values per conversion task: large enough that a thread's start-up is noise.
constexpr int64_t kConvertGrain = int64_t{1} << 16;

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// The folder without trailing slashes, so that `dir + ".tmp"` is a sibling and not a child.
std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// One tensor of the checkpoint and the file that holds it.
struct Found {
  const SafetensorsFile* file = nullptr;
  const SafetensorsEntry* entry = nullptr;
};

// The checkpoint's tensors, mapped; `listing` is the file that says which tensors exist
// (model.safetensors, or the index), the one named when a tensor is missing.
struct Checkpoint {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, Found> tensors;
  std::string listing;
};

bool file_exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

// A shard must sit in the checkpoint folder: a plain file name, no path.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

void open_single(const std::string& path, Checkpoint* ck) {
  ck->listing = path;
  ck->files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
  const SafetensorsFile* file = ck->files.back().get();
  for (const SafetensorsEntry& e : file->entries()) ck->tensors[e.name] = {file, &e};
}

void open_sharded(const std::string& dir, const std::string& index_path, Checkpoint* ck) {
  ck->listing = index_path;
  json index = json_read_file_strict(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
    throw_input_error(index_path, "expected an object with a 'weight_map' object (tensor name → shard file)");
  // shard file → the tensors the index puts in it
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, shard] : index.at("weight_map").items()) {
    if (!shard.is_string() || !plain_file_name(shard.get<std::string>()))
      throw_input_error(index_path, "weight_map: tensor '" + name + "' is mapped to " + shard.dump() +
                                        ", expected the file name of a shard in " + dir);
    shards[shard.get<std::string>()].push_back(name);
  }
  for (const auto& [shard, names] : shards) {
    std::string path = join(dir, shard);
    if (!file_exists(path))
      throw_input_error(index_path, "weight_map: tensor '" + names.front() + "' is mapped to shard '" +
                                        shard + "', which does not exist");
    ck->files.push_back(std::make_unique<SafetensorsFile>(SafetensorsFile::open(path)));
    const SafetensorsFile* file = ck->files.back().get();
    for (const std::string& name : names) {
      const SafetensorsEntry* e = file->find(name);
      if (!e)
        throw_input_error(path,
                          "tensor '" + name + "' is missing (" + kIndexFile + " maps it to this shard)");
      ck->tensors[name] = {file, e};
    }
    // Each name maps to one shard, so a tensor also stored in another shard shows up here.
    for (const SafetensorsEntry& e : file->entries()) {
      auto it = index.at("weight_map").find(e.name);
      if (it == index.at("weight_map").end() || it->get<std::string>() != shard)
        throw_input_error(path, "tensor '" + e.name + "' is not listed for this shard in " + kIndexFile);
    }
  }
}

Checkpoint checkpoint_open(const std::string& dir) {
  Checkpoint ck;
  std::string single = join(dir, kSingleFile), index = join(dir, kIndexFile);
  if (file_exists(single)) {
    open_single(single, &ck);
  } else if (file_exists(index)) {
    open_sharded(dir, index, &ck);
  } else {
    throw_input_error(dir, std::string("no ") + kSingleFile + " or " + kIndexFile + " in this folder");
  }
  return ck;
}

bool is_float_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f64;
}

// Checks dtype and shape of a stored tensor against what the config asks for.
void check_stored(const Found& f, const std::string& name, const Shape& expected) {
  const std::string& path = f.file->path();
  if (!is_float_dtype(f.entry->dtype))
    throw_input_error(path, "tensor '" + name + "': dtype " + dtype_name(f.entry->dtype) +
                                " is not a float type (expected F32, BF16 or F64)");
  if (f.entry->shape != expected.vec())
    throw_input_error(path, "tensor '" + name + "': expected " + expected.str() +
                                " from config.json, found " + f.entry->shape_str());
}

// Converts element i of stored bytes to fp32; memcpy because mapped data may be unaligned.
inline float load_f32(const uint8_t* src, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::bf16: {
      bf16 v;
      std::memcpy(&v.bits, src + 2 * i, 2);
      return bf16_to_float(v);
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, src + 8 * i, 8);
      return static_cast<float>(v);
    }
    default: {
      float v;
      std::memcpy(&v, src + 4 * i, 4);
      return v;
    }
  }
}

// Elements [first, first + count) of a stored tensor, converted to fp32.
void convert_to_f32(const Found& f, int64_t first, int64_t count, float* dst) {
  const uint8_t* src = f.file->bytes(*f.entry) + first * static_cast<int64_t>(dtype_size(f.entry->dtype));
  DType dtype = f.entry->dtype;
  parallel_for(count, kConvertGrain, [&](int64_t b, int64_t e) {
    if (dtype == DType::f32) {
      std::memcpy(dst + b, src + 4 * b, static_cast<size_t>(e - b) * 4);
      return;
    }
    for (int64_t i = b; i < e; ++i) dst[i] = load_f32(src, dtype, i);
  });
}

// Index of the first element where two stored tensors of one shape differ as fp32, or -1.
int64_t first_difference(const Found& a, const Found& b) {
  const uint8_t *sa = a.file->bytes(*a.entry), *sb = b.file->bytes(*b.entry);
  const DType da = a.entry->dtype, db = b.entry->dtype;
  const int64_t n = a.entry->numel();
  const auto differ = [&](int64_t i) {
    float va = load_f32(sa, da, i), vb = load_f32(sb, db, i);
    return std::memcmp(&va, &vb, sizeof va) != 0;
  };
  std::atomic<bool> differs{false};
  parallel_for(n, kConvertGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (differ(i)) {
        differs = true;
        return;
      }
    }
  });
  if (!differs) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (differ(i)) return i;
  return -1;
}

// The checkpoint's tensors in table order, validated, read a flat range at a time.
class HfCheckpointSource final : public ParamSource {
 public:
  HfCheckpointSource(Checkpoint ck, std::vector<Found> sources, const ParamTable& table)
      : ck_(std::move(ck)), sources_(std::move(sources)), ranges_(table) {}
  void read(int64_t begin, int64_t count, float* dst) override {
    for (const HfTensorRanges::Piece& piece : ranges_.pieces(begin, count))
      convert_to_f32(sources_[piece.tensor], piece.first, piece.count, dst + piece.at);
  }

 private:
  Checkpoint ck_;               // keeps the files mapped
  std::vector<Found> sources_;  // per table.hf_tensors
  HfTensorRanges ranges_;
};

[[noreturn]] void fs_failure(const std::string& path, const std::string& what, const std::error_code& ec) {
  throw_runtime_failure(path, what + ": " + ec.message());
}

std::string shard_name(size_t i, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return name;
}

// Removes the folder a save writes into when the save leaves (after a successful one it has been
// renamed into place, and there is nothing left to remove): a save that fails (a full disk, a
// read of the weights that throws) leaves no DIR.tmp behind.
class TmpFolder {
 public:
  explicit TmpFolder(std::string path) : path_(std::move(path)) {}
  ~TmpFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TmpFolder(const TmpFolder&) = delete;
  TmpFolder& operator=(const TmpFolder&) = delete;

 private:
  std::string path_;
};

}  // namespace

ModelConfig hf_checkpoint_read_config(const std::string& dir) {
  return model_config_load(join(dir, "config.json"));
}

std::unique_ptr<ParamSource> hf_checkpoint_open_params(const std::string& dir, const ModelConfig& config,
                                                       const ParamTable& table) {
  Checkpoint ck = checkpoint_open(dir);
  std::vector<Found> sources;
  sources.reserve(table.hf_tensors.size());
  for (const HfTensorSpec& spec : table.hf_tensors) {
    auto it = ck.tensors.find(spec.hf_name);
    if (it == ck.tensors.end())
      throw_input_error(ck.listing, "tensor '" + spec.hf_name + "' is missing (expected " + spec.shape.str() +
                                        " from config.json)");
    check_stored(it->second, spec.hf_name, spec.shape);
    sources.push_back(it->second);
  }
  const Found* tied_lm_head = nullptr;
  for (const auto& [name, found] : ck.tensors) {
    if (table.find_hf(name)) continue;
    if (name == kLmHead && config.tie_word_embeddings) {
      check_stored(found, name, table.find_hf(kEmbedding)->shape);
      tied_lm_head = &found;
      continue;
    }
    throw_input_error(found.file->path(), "tensor '" + name + "' is unexpected: not a tensor of the " +
                                              config.model_type + " model config.json describes (" +
                                              std::to_string(config.num_hidden_layers) +
                                              " layers, tie_word_embeddings " +
                                              (config.tie_word_embeddings ? "true" : "false") + ")");
  }
  if (tied_lm_head) {
    int64_t at = first_difference(*tied_lm_head, ck.tensors.at(kEmbedding));
    if (at >= 0)
      throw_input_error(tied_lm_head->file->path(), std::string("tensor '") + kLmHead + "' differs from " +
                                                        kEmbedding + " (first at element " +
                                                        std::to_string(at) +
                                                        "), but config.json sets tie_word_embeddings: true");
  }
  return std::make_unique<HfCheckpointSource>(std::move(ck), std::move(sources), table);
}

std::unique_ptr<ParamSource> hf_tensors_open(const std::string& path, const ParamTable& table) {
  if (!file_exists(path)) throw_input_error(path, "cannot open: no such file");
  Checkpoint ck;
  open_single(path, &ck);
  std::vector<Found> sources;
  sources.reserve(table.hf_tensors.size());
  for (const HfTensorSpec& spec : table.hf_tensors) {
    auto it = ck.tensors.find(spec.hf_name);
    if (it == ck.tensors.end())
      throw_input_error(path, "tensor '" + spec.hf_name + "' is missing (expected " + spec.shape.str() + ")");
    check_stored(it->second, spec.hf_name, spec.shape);
    sources.push_back(it->second);
  }
  for (const auto& [name, found] : ck.tensors)
    if (!table.find_hf(name)) throw_input_error(path, "tensor '" + name + "' is unexpected");
  return std::make_unique<HfCheckpointSource>(std::move(ck), std::move(sources), table);
}

void hf_tensors_save(const std::string& path, const ParamTable& table, ParamSource& params, DType storage) {
  LOOM_ASSERT(storage == DType::f32 || storage == DType::bf16, "tensors are stored as f32 or bf16");
  const HfTensorRanges ranges(table);
  std::vector<SafetensorsTensor> tensors;
  std::vector<int64_t> offsets;
  for (size_t i = 0; i < table.hf_tensors.size(); ++i) {
    const HfTensorSpec& spec = table.hf_tensors[i];
    tensors.push_back({spec.hf_name, storage, spec.shape, nullptr, DType::f32});
    offsets.push_back(ranges.offset(i));
  }
  safetensors_write_streamed(path, tensors, {{"format", "pt"}},
                             [&](size_t tensor, int64_t first, int64_t count, float* dst) {
                               params.read(offsets[tensor] + first, count, dst);
                             });
}

void hf_checkpoint_load_params(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                               float* params) {
  hf_checkpoint_open_params(dir, config, table)->read(0, table.total_numel, params);
}

void hf_checkpoint_save(const std::string& dir_arg, const ModelConfig& config, const ParamTable& table,
                        ParamSource& params, DType storage, int64_t max_shard_bytes) {
  LOOM_ASSERT(storage == DType::f32 || storage == DType::bf16, "checkpoints are stored as f32 or bf16");
  LOOM_ASSERT(max_shard_bytes >= 0, "max_shard_bytes must be >= 0");
  const std::string dir = strip_slashes(dir_arg);
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) fs_failure(tmp, "cannot remove the leftover folder", ec);
  const TmpFolder removed_on_failure(tmp);
  fs::create_directories(tmp, ec);
  if (ec) fs_failure(tmp, "cannot create folder", ec);

  ModelConfig stored = config;
  stored.dtype = storage == DType::bf16 ? "bfloat16" : "float32";
  file_write_atomic(join(tmp, "config.json"), model_config_to_json(stored).dump(2) + "\n");

  // Per shard: its tensors, and their flat offsets (where their values are read from).
  const HfTensorRanges ranges(table);
  std::vector<std::vector<SafetensorsTensor>> shards(1);
  std::vector<std::vector<int64_t>> offsets(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (size_t i = 0; i < table.hf_tensors.size(); ++i) {
    const HfTensorSpec& spec = table.hf_tensors[i];
    int64_t bytes = spec.shape.numel() * static_cast<int64_t>(dtype_size(storage));
    if (max_shard_bytes > 0 && !shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      offsets.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back({spec.hf_name, storage, spec.shape, nullptr, DType::f32});
    offsets.back().push_back(ranges.offset(i));
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  const auto write_shard = [&](const std::string& path, size_t s) {
    safetensors_write_streamed(path, shards[s], metadata,
                               [&](size_t tensor, int64_t first, int64_t count, float* dst) {
                                 params.read(offsets[s][tensor] + first, count, dst);
                               });
  };
  if (shards.size() == 1) {
    write_shard(join(tmp, kSingleFile), 0);
  } else {
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string name = shard_name(i, shards.size());
      write_shard(join(tmp, name), i);
      for (const SafetensorsTensor& t : shards[i]) weight_map[t.name] = name;
    }
    json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    file_write_atomic(join(tmp, kIndexFile), index.dump(2) + "\n");
  }

  fs::remove_all(dir, ec);
  if (ec) fs_failure(dir, "cannot remove the previous checkpoint", ec);
  fs::rename(tmp, dir, ec);
  if (ec) fs_failure(dir, "cannot rename " + tmp + " into place", ec);
  fs::path parent = fs::path(dir).parent_path();
  file_sync_dir(parent.empty() ? "." : parent.string());
}

void hf_checkpoint_save(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                        const float* params, DType storage, int64_t max_shard_bytes) {
  ArrayParamSource source(params, table.total_numel);
  hf_checkpoint_save(dir, config, table, source, storage, max_shard_bytes);
}

}  // namespace loom
