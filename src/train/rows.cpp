#include "train/rows.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_strict.h"
#include "data/row_store.h"
#include "data/sha256.h"
#include "parallel/context_split.h"

namespace loom {
namespace {

// A row's position_ids (HF's padding-free convention) → its sample boundaries b_0..b_n:
// a sample starts at each 0 and counts up by one; the row's samples fill it (b_n =
// row_tokens: a .jsonl row has no padding of its own).
void bounds_from_position_ids(const nlohmann::json& positions, int64_t row_tokens, const std::string& where,
                              std::vector<int32_t>& bounds) {
  if (static_cast<int64_t>(positions.size()) != row_tokens)
    throw_input_error(where, "position_ids has " + std::to_string(positions.size()) + " entries, tokens " +
                                 std::to_string(row_tokens) + "; expected equal lengths");
  int64_t previous = -1;
  for (size_t i = 0; i < positions.size(); ++i) {
    const auto& p = positions[i];
    const int64_t value = p.is_number_integer() ? p.get<int64_t>() : -1;
    if (value == 0) {
      bounds.push_back(static_cast<int32_t>(i));
    } else if (value != previous + 1 || previous < 0) {
      throw_input_error(where, "position_ids[" + std::to_string(i) + "] = " + p.dump() + ", expected " +
                                   (previous < 0 ? std::string("0 (a sample starts at position 0)")
                                                 : "0 (a new sample) or " + std::to_string(previous + 1)));
    }
    previous = value;
  }
  bounds.push_back(static_cast<int32_t>(row_tokens));
}

}  // namespace

void RowSet::row_targets(int64_t r, int32_t* targets) const {
  const int32_t* tok = row_tokens_ptr(r);
  const uint8_t* mask = row_mask_ptr(r);
  for (int64_t t = 0; t < row_tokens; ++t) targets[t] = t + 1 < row_tokens && mask[t + 1] ? tok[t + 1] : -1;
  if (!isolated()) return;
  // The last token of a sample predicts nothing (the next sample's first token is no
  // target), nor does padding.
  const std::span<const int32_t> bounds = row_bounds(r);
  for (int32_t b : bounds)
    if (b > 0) targets[b - 1] = -1;
  for (int64_t t = bounds.back(); t < row_tokens; ++t) targets[t] = -1;
}

int64_t RowSet::row_target_count(int64_t r) const {
  std::vector<int32_t> targets(static_cast<size_t>(row_tokens));
  row_targets(r, targets.data());
  int64_t n = 0;
  for (int32_t target : targets) n += target >= 0 ? 1 : 0;
  return n;
}

void rows_hash(RowSet& set) {
  Sha256 sha;
  for (int64_t r = 0; r < set.rows; ++r) {
    sha.update(set.row_tokens_ptr(r), static_cast<size_t>(set.row_tokens) * sizeof(int32_t));
    sha.update(set.row_mask_ptr(r), static_cast<size_t>(set.row_tokens));
    if (set.isolated()) row_bounds_hash(sha, set.row_bounds(r));
  }
  set.rows_sha256 = sha.hex_digest();
}

RowSet rows_load_jsonl(const std::string& path, int64_t row_tokens, int64_t vocab_size) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open the rows file");
  RowSet set;
  set.row_tokens = row_tokens;
  std::string line;
  int64_t line_number = 0;
  std::vector<std::vector<int32_t>> bounds;  // each row's, kept when any row has position_ids
  bool any_positions = false;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_number);
    StrictJson parsed = json_parse_strict(line);
    const nlohmann::json& row = parsed.value;
    if (row.is_discarded() || !row.is_object())
      throw_input_error(where, "not a JSON object; expected {\"tokens\": [...], \"loss_mask\": [...]}");
    if (parsed.duplicate)
      throw_input_error(where,
                        "found the key '" + *parsed.duplicate + "' a second time, expected each key once");
    for (const char* key : {"tokens", "loss_mask"})
      if (!row.contains(key) || !row.at(key).is_array())
        throw_input_error(where, std::string("field '") + key + "' missing or not an array");
    const auto& tokens = row.at("tokens");
    const auto& mask = row.at("loss_mask");
    if (mask.size() != tokens.size())
      throw_input_error(where, "loss_mask has " + std::to_string(mask.size()) + " entries, tokens " +
                                   std::to_string(tokens.size()) + "; expected equal lengths");
    if (static_cast<int64_t>(tokens.size()) != row_tokens)
      throw_input_error(where, "row has " + std::to_string(tokens.size()) +
                                   " tokens, expected row_tokens = " + std::to_string(row_tokens));
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto& id = tokens[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size)
        throw_input_error(where, "tokens[" + std::to_string(i) + "] = " + id.dump() +
                                     ", expected an integer id in [0, " + std::to_string(vocab_size) + ")");
      const auto& m = mask[i];
      if (!m.is_number_integer() || (m.get<int64_t>() != 0 && m.get<int64_t>() != 1))
        throw_input_error(where, "loss_mask[" + std::to_string(i) + "] = " + m.dump() + ", expected 0 or 1");
      set.tokens.push_back(static_cast<int32_t>(id.get<int64_t>()));
      set.loss_mask.push_back(static_cast<uint8_t>(m.get<int64_t>()));
    }
    std::vector<int32_t> row_bounds;
    if (row.contains("position_ids")) {
      if (!row.at("position_ids").is_array())
        throw_input_error(where, "field 'position_ids' is not an array");
      bounds_from_position_ids(row.at("position_ids"), row_tokens, where, row_bounds);
    } else {
      row_bounds = {0,
                    static_cast<int32_t>(row_tokens)};  // one sample, if another row makes the file isolated
    }
    bounds.push_back(std::move(row_bounds));
    any_positions = any_positions || row.contains("position_ids");
    ++set.rows;
  }
  if (set.rows == 0) throw_input_error(path, "no rows");
  if (any_positions) {
    set.sample_index.push_back(0);
    for (const std::vector<int32_t>& b : bounds) {
      set.sample_bounds.insert(set.sample_bounds.end(), b.begin(), b.end());
      set.sample_index.push_back(static_cast<int64_t>(set.sample_bounds.size()));
    }
  }
  rows_hash(set);
  return set;
}

RowSet rows_load_store(const std::string& dir, int64_t row_tokens, int64_t vocab_size,
                       const std::string& run_tokenizer_dir) {
  RowStoreExpect expect;
  expect.row_tokens = row_tokens;
  expect.vocab_size = vocab_size;
  if (!run_tokenizer_dir.empty() &&
      std::filesystem::exists(std::filesystem::path(run_tokenizer_dir) / "tokenizer.json"))
    expect.tokenizer_sha256 = tokenizer_files_sha256(run_tokenizer_dir);
  const RowStore store = RowStore::open(dir, expect);
  RowSet set;
  set.row_tokens = store.row_tokens();
  set.rows = store.rows();
  const size_t cells = static_cast<size_t>(store.rows() * store.row_tokens());
  set.tokens.assign(store.tokens(), store.tokens() + cells);
  set.loss_mask.assign(store.loss_mask(), store.loss_mask() + cells);
  if (store.isolated()) {
    set.sample_index.assign(store.sample_index().begin(), store.sample_index().end());
    set.sample_bounds.assign(store.sample_bounds().begin(), store.sample_bounds().end());
  }
  set.rows_sha256 = store.manifest()["rows_sha256"].get<std::string>();  // RowStore::open verified it
  if (store.manifest().contains("tokenizer_sha256"))
    set.tokenizer_sha256 = store.manifest()["tokenizer_sha256"].dump();
  return set;
}

RowSet rows_load(const std::string& path, int64_t row_tokens, int64_t vocab_size,
                 const std::string& run_tokenizer_dir) {
  if (std::filesystem::is_directory(path))
    return rows_load_store(path, row_tokens, vocab_size, run_tokenizer_dir);
  return rows_load_jsonl(path, row_tokens, vocab_size);
}

MicroBatch MicroBatchData::view() {
  const int64_t t = static_cast<int64_t>(ids.size()), r = static_cast<int64_t>(loss_positions.size());
  MicroBatch b;
  b.ids = Tensor{ids.data(), {t}, DType::i32, Device::cpu};
  b.targets = Tensor{targets.data(), {t}, DType::i32, Device::cpu};
  b.rows = rows;
  b.routing_census = routing_census;
  b.aux_loss_weight = aux_loss_weight;
  if (lora_dropout > 0) {
    b.lora_dropout = {lora_dropout, lora_dropout_seed, lora_dropout_step,
                      Tensor{lora_dropout_tokens.data(), {t, 2}, DType::i32, Device::cpu}};
  }
  b.context = context;
  if (!cp_row_order.empty()) {
    const auto all = static_cast<int64_t>(cp_row_order.size());
    b.cp_row_order = Tensor{cp_row_order.data(), {all}, DType::i32, Device::cpu};
    b.cp_rank_order = Tensor{cp_rank_order.data(), {all}, DType::i32, Device::cpu};
  }
  if (r > 0) {
    b.loss_positions = Tensor{loss_positions.data(), {r}, DType::i32, Device::cpu};
    b.loss_targets = Tensor{loss_targets.data(), {r}, DType::i32, Device::cpu};
    b.loss_rows = loss_rows;
  }
  return b;
}

void loss_rows_build(MicroBatchData& batch, int64_t granule) {
  LOOM_ASSERT(granule >= 1, "loss_rows_build: granule < 1");
  batch.loss_positions.clear();
  batch.loss_targets.clear();
  batch.loss_rows = 0;
  const int64_t t = static_cast<int64_t>(batch.targets.size());
  int64_t with_target = 0;
  for (int32_t target : batch.targets) with_target += target >= 0 ? 1 : 0;
  const int64_t padded = std::max<int64_t>(1, (with_target + granule - 1) / granule) * granule;
  if (padded >= t) return;
  for (int64_t p = 0; p < t; ++p) {
    if (batch.targets[static_cast<size_t>(p)] < 0) continue;
    batch.loss_positions.push_back(static_cast<int32_t>(p));
    batch.loss_targets.push_back(batch.targets[static_cast<size_t>(p)]);
  }
  batch.loss_positions.resize(static_cast<size_t>(padded), 0);
  batch.loss_targets.resize(static_cast<size_t>(padded), -1);
  batch.loss_rows = with_target;
}

MicroBatchData micro_batch_build(const RowSet& data, const std::vector<int64_t>& row_indices) {
  MicroBatchData mb;
  mb.rows.offsets.push_back(0);
  for (int64_t r : row_indices) {
    const int32_t* tok = data.row_tokens_ptr(r);
    const int32_t row_begin = static_cast<int32_t>(mb.ids.size());
    mb.ids.insert(mb.ids.end(), tok, tok + data.row_tokens);
    mb.targets.resize(mb.ids.size());
    data.row_targets(r, mb.targets.data() + row_begin);
    // Each sample is an attention span of its own (RoPE from 0), and so is the padding:
    // no sample attends to it, and what it computes reaches no target.
    if (data.isolated())
      for (int32_t b : data.row_bounds(r).subspan(1))
        if (b < data.row_tokens) mb.rows.offsets.push_back(row_begin + b);
    mb.rows.offsets.push_back(static_cast<int32_t>(mb.ids.size()));
  }
  loss_rows_build(mb);
  return mb;
}

void micro_batch_lora_dropout(MicroBatchData& batch, const std::vector<int64_t>& positions,
                              int64_t row_tokens, double p, uint64_t seed, int64_t step) {
  LOOM_ASSERT(static_cast<int64_t>(batch.ids.size()) == static_cast<int64_t>(positions.size()) * row_tokens,
              "LoRA dropout's tokens: a micro-batch of whole rows");
  batch.lora_dropout = p;
  batch.lora_dropout_seed = seed;
  batch.lora_dropout_step = step;
  batch.lora_dropout_tokens.clear();
  for (int64_t row : positions)
    for (int64_t i = 0; i < row_tokens; ++i) {
      batch.lora_dropout_tokens.push_back(static_cast<int32_t>(row));
      batch.lora_dropout_tokens.push_back(static_cast<int32_t>(i));
    }
}

void micro_batch_context_split(MicroBatchData& batch, int64_t row_tokens, int64_t cp, int64_t cp_rank) {
  if (cp == 1) return;
  const auto tokens = static_cast<int64_t>(batch.ids.size());
  const ContextShard shard = context_shard(batch.rows.offsets, row_tokens, cp, cp_rank);
  std::vector<int32_t> ids, targets, dropout_tokens;
  for (int32_t t : shard.source) {
    ids.push_back(batch.ids[static_cast<size_t>(t)]);
    targets.push_back(batch.targets[static_cast<size_t>(t)]);
    if (!batch.lora_dropout_tokens.empty())
      for (size_t k = 0; k < 2; ++k)
        dropout_tokens.push_back(batch.lora_dropout_tokens[2 * static_cast<size_t>(t) + k]);
  }
  batch.ids = std::move(ids);
  batch.targets = std::move(targets);
  batch.lora_dropout_tokens = std::move(dropout_tokens);
  // The rank's tokens are one span of their own positions: under CP attention reads
  // `context`, and RoPE the positions.
  const auto local = static_cast<int32_t>(batch.ids.size());
  batch.rows = RowSpans{{0, local}, shard.positions};
  batch.context.key_begin = shard.key_begin;
  batch.context.key_end.clear();
  for (int32_t t : shard.source) batch.context.key_end.push_back(t + 1);
  batch.cp_rank_order = context_rank_order(tokens, row_tokens, cp);
  batch.cp_row_order = context_row_order(tokens, row_tokens, cp);
  loss_rows_build(batch);
}

std::vector<int64_t> step_rows(const RowSet& data, int64_t step, int64_t global_batch) {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(global_batch));
  for (int64_t i = 0; i < global_batch; ++i) rows.push_back(((step - 1) * global_batch + i) % data.rows);
  return rows;
}

}  // namespace loom
