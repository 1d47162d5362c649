#include "plan/plan.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/json_strict.h"
#include "data/row_store.h"
#include "model/shard_spec.h"
#include "ops/op_workspace.h"
#include "ops/thd_groups.h"
#include "parallel/micro_batching.h"
#include "recipe/price_table.h"

namespace loom {
namespace {

std::string lower(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string gib(int64_t bytes) {
  return format("%.2f", static_cast<double>(bytes) / static_cast<double>(kGiB));
}

// 35163 -> "35,163"
std::string thousands(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string recompute_label(const RecomputeSpec& r) {
  if (!r.enabled) return "none";
  if (r.granularity == "selective") return "selective";
  return "full " + r.method + " " + std::to_string(r.num_layers);
}

std::string offload_label(const OffloadSpec& o) {
  if (!o.enabled) return "none";
  return format("%g", o.optimizer_fraction) + (o.overlap ? "" : " (no overlap)");
}

// A GPU of the table with another memory size (gpu.memory_gb differing from the
// datasheet's, e.g. an H100 NVL's 94 GB): the usable share scales with it.
GpuSpec with_memory(GpuSpec gpu, double memory_gb) {
  if (memory_gb > 0 && memory_gb != gpu.vendor_memory_gb) {
    gpu.usable_bytes =
        static_cast<int64_t>(static_cast<double>(gpu.usable_bytes) * memory_gb / gpu.vendor_memory_gb);
    gpu.vendor_memory_gb = memory_gb;
  }
  return gpu;
}

}  // namespace

const std::vector<GpuSpec>& gpu_table() {
  static const std::vector<GpuSpec> table = {
      // H100 SXM: nvidia-smi 81,559 MiB, cudaMemGetInfo 81,090 MiB; HBM3 3.35 TB/s; 132 SMs.
      {"H100", 80, 81090 * kMiB, 989e12, 3.35e12, 132},
      // H200 SXM: nvidia-smi 143,771 MiB (bench/results), less the H100's 469 MiB (GUESS);
      // HBM3e 4.8 TB/s; 132 SMs.
      {"H200", 141, (143771 - 469) * kMiB, 989e12, 4.8e12, 132},
  };
  return table;
}

const GpuSpec* gpu_find(const std::string& name) {
  std::string key = lower(name);
  for (const char* prefix : {"nvidia "}) {
    if (key.rfind(prefix, 0) == 0) key = key.substr(std::string(prefix).size());
  }
  for (const GpuSpec& gpu : gpu_table()) {
    const std::string entry = lower(gpu.name);
    if (key == entry || key.rfind(entry + " ", 0) == 0 || key.rfind(entry + "-", 0) == 0) return &gpu;
  }
  return nullptr;
}

PlanInput plan_input_from_recipe(const Recipe& recipe) {
  PlanInput in;
  in.model = recipe.model_config;
  in.model_name = recipe.model;
  in.workload = recipe.workload;
  in.layout = recipe.layout;
  in.checkpoints = recipe.train.checkpoint_every > 0;
  in.steps = recipe.train.steps;
  in.lora = lora_config_of(recipe.train.lora);
  if (std::filesystem::exists(std::filesystem::path(recipe.train.data_path) / "samples.bin")) {
    RowStoreExpect expect;
    expect.verify_rows_sha256 = false;  // the run checks it; the plan reads the boundaries alone
    const RowStore store = RowStore::open(recipe.train.data_path, expect);
    for (int64_t r = 0; r < store.rows(); ++r) {
      const std::span<const int32_t> b = store.row_bounds(r);
      const int32_t padding = static_cast<int32_t>(store.row_tokens()) - b.back();
      int32_t longest = padding;
      for (size_t k = 1; k < b.size(); ++k) longest = std::max(longest, b[k] - b[k - 1]);
      in.isolated_spans.push_back(static_cast<int32_t>(b.size() - 1) + (padding > 0 ? 1 : 0));
      in.isolated_longest.push_back(longest);
    }
  }
  if (!recipe.train.eval_path.empty()) {
    in.eval_every = recipe.train.eval_every;
    in.eval_rows = recipe.train.eval_max_rows;
    const std::filesystem::path manifest = std::filesystem::path(recipe.train.eval_path) / "manifest.json";
    if (std::filesystem::exists(manifest)) {
      const nlohmann::json m = json_read_file_strict(manifest.string());
      if (m.is_object() && m.contains("rows") && m["rows"].is_number_integer()) {
        const int64_t rows = m["rows"].get<int64_t>();
        in.eval_rows = in.eval_rows > 0 ? std::min(in.eval_rows, rows) : rows;
      }
    }
  }
  in.gpus_per_node = in.constants.default_gpus_per_node;
  const YAML::Node gpu = recipe.document["gpu"];
  std::string type;
  double memory_gb = 0;
  if (gpu && gpu.IsMap()) {
    if (gpu["type"] && gpu["type"].IsScalar()) type = gpu["type"].as<std::string>();
    if (gpu["memory_gb"] && gpu["memory_gb"].IsScalar()) memory_gb = gpu["memory_gb"].as<double>();
    if (gpu["per_node"] && gpu["per_node"].IsScalar()) in.gpus_per_node = gpu["per_node"].as<int64_t>();
  }
  const GpuSpec& fallback = *gpu_find("H200");
  if (!type.empty()) {
    if (const GpuSpec* known = gpu_find(type)) {
      in.gpu = with_memory(*known, memory_gb);
      in.gpu_source = "gpu.type";
    } else if (memory_gb > 0) {
      // An unknown GPU: its memory from memory_gb at the H200's usable share, H200 rates.
      in.gpu = with_memory(fallback, memory_gb);
      in.gpu.name = type;
      in.gpu_source = "gpu.memory_gb (gpu.type " + type + " is not in the table: H200 rates assumed)";
    } else {
      std::string names;
      for (const GpuSpec& g : gpu_table()) names += (names.empty() ? "" : ", ") + g.name;
      throw_input_error(recipe.path, "gpu.type: found " + type + ", expected one of " + names +
                                         " (or give gpu.memory_gb to plan another GPU)");
    }
    return in;
  }
  if (!recipe.gpu_instance.empty()) {
    if (auto entry = price_table_find(price_table(), recipe.gpu_instance)) {
      if (const GpuSpec* known = gpu_find(entry->gpu)) {
        in.gpu = with_memory(*known, memory_gb);
        in.gpu_source = "gpu.instance " + entry->instance + " (data/instance_prices.yaml)";
        return in;
      }
    }
  }
  in.gpu = with_memory(fallback, memory_gb);
  in.gpu_source = memory_gb > 0 ? "gpu.memory_gb (no gpu.type: H200 rates assumed)"
                                : "the recipe names no GPU: an H200 assumed (--set gpu.type=H100 to change)";
  return in;
}

MicroBatchShape plan_micro_batches(const WorkloadSpec& workload, const LayoutSpec& layout) {
  MicroBatchShape shape;
  shape.row_tokens = workload.row_tokens;
  int64_t rows = std::max<int64_t>(1, layout.max_tokens_per_gpu * layout.cp / workload.row_tokens);
  if (layout.rows_per_microbatch > 0) rows = std::min(rows, layout.rows_per_microbatch);
  const int64_t cap = rows * workload.row_tokens / layout.cp;
  const std::vector<int64_t> lengths(static_cast<size_t>(workload.global_batch), workload.row_tokens);
  const MicroBatchPlan plan =
      micro_batches_plan(lengths, cap, static_cast<int>(layout.cp), static_cast<int>(layout.dp));
  shape.micro_batches = plan.num_microbatches();
  for (const auto& rank : plan.per_rank)
    for (const auto& micro : rank)
      shape.rows = std::max<int64_t>(shape.rows, static_cast<int64_t>(micro.size()));
  shape.tokens = shape.rows * workload.row_tokens;
  return shape;
}

RowSpans isolated_micro_batch_spans(const IsolatedShape& iso, int64_t rows, int64_t row_tokens) {
  RowSpans spans;
  spans.offsets.push_back(0);
  const int64_t tokens = rows * row_tokens;
  if (iso.spans > 1 && iso.longest < tokens) {
    const int64_t others = iso.spans - 1, rest = tokens - iso.longest;
    spans.offsets.push_back(static_cast<int32_t>(iso.longest));
    for (int64_t i = 0; i < others; ++i)
      spans.offsets.push_back(static_cast<int32_t>(iso.longest + rest * (i + 1) / others));
    return spans;
  }
  for (int64_t r = 1; r <= rows; ++r) spans.offsets.push_back(static_cast<int32_t>(r * row_tokens));
  return spans;
}

namespace {

// The bucketed tokens (sequences × longest) of the largest THD backward call over these
// spans, in the CUDA ops' groups of calls (ops/thd_groups.h); spans of equal lengths run as
// plain rows, in one call of all their tokens.
int64_t largest_thd_call_tokens(const RowSpans& spans, const HeadLayout& heads) {
  const int32_t first = spans.offsets[1] - spans.offsets[0];
  bool equal = true;
  for (size_t i = 1; i < spans.offsets.size(); ++i)
    equal = equal && spans.offsets[i] - spans.offsets[i - 1] == first;
  if (equal) return spans.tokens();
  int64_t most = 0;
  for (const ThdGroup& g : thd_backward_groups(spans.offsets, thd_workspace_model(heads)))
    most = std::max(most, g.sequences * g.sequence_tokens);
  return most;
}

}  // namespace

IsolatedShape isolated_attention_shape(const PlanInput& in, int64_t rows) {
  const auto stored = static_cast<int64_t>(in.isolated_spans.size());
  if (stored == 0 || rows <= 0) return {};
  const HeadLayout heads = shard_heads(in.model, in.layout.tp);
  const int64_t row_tokens = in.workload.row_tokens;
  const int64_t batch = std::max<int64_t>(in.workload.global_batch, 1);
  IsolatedShape most;
  int64_t most_tokens = 0;
  // A step's rows start where the last one's ended, wrapping around (train/rows.h step_rows):
  // the starts repeat after stored / gcd(stored, batch) steps.
  for (int64_t step = 0; step < std::max<int64_t>(in.steps, 1); ++step) {
    const int64_t start = step * batch % stored;
    if (step > 0 && start == 0) break;
    for (int64_t first = 0; first < batch; first += rows) {
      IsolatedShape shape;
      for (int64_t i = first; i < std::min(first + rows, batch); ++i) {
        const auto r = static_cast<size_t>((start + i) % stored);
        shape.spans += in.isolated_spans[r];
        shape.longest = std::max<int64_t>(shape.longest, in.isolated_longest[r]);
      }
      const int64_t tokens = largest_thd_call_tokens(
          isolated_micro_batch_spans(shape, std::min(rows, batch - first), row_tokens), heads);
      if (most.spans == 0 || tokens > most_tokens) {
        most = shape;
        most_tokens = tokens;
      }
    }
  }
  return most;
}

int64_t isolated_attention_tokens(const PlanInput& in, int64_t rows) {
  const IsolatedShape shape = isolated_attention_shape(in, rows);
  if (shape.spans == 0) return 0;
  return largest_thd_call_tokens(isolated_micro_batch_spans(shape, rows, in.workload.row_tokens),
                                 shard_heads(in.model, in.layout.tp));
}

Plan plan_layout(const PlanInput& input) {
  const auto plan_with = [&](bool by_row) {
    Plan plan;
    plan.input = input;
    plan.input.attention_backward_by_row = by_row;
    plan.micro = plan_micro_batches(input.workload, input.layout);
    plan.memory = plan_memory(plan.input, plan.micro);
    plan.time = plan_time(plan.input, plan.micro);
    if (input.eval_every > 0 && input.eval_rows > 0) {
      const int64_t per_rank = (input.eval_rows + input.layout.dp - 1) / input.layout.dp;
      const int64_t micro_batches = (per_rank + plan.micro.rows - 1) / plan.micro.rows;
      plan.time.eval_s =
          static_cast<double>(micro_batches + input.layout.pp - 1) * plan.time.micro_batch_s / 3.0;
    }
    plan.fits = plan.memory.peak().device_bytes() <= input.gpu.usable_bytes;
    return plan;
  };
  Plan batched = plan_with(false);
  if (batched.fits || batched.micro.rows <= 1) return batched;
  return plan_with(true);
}

Plan plan_for_training(const Recipe& recipe, bool require_fit) {
  Plan plan = plan_layout(plan_input_from_recipe(recipe));
  if (plan.fits || !require_fit) return plan;
  throw_input_error(
      recipe.path,
      "layout: loom plan predicts it does not fit on the GPU (--force trains anyway)\n" + plan_to_text(plan));
}

std::string plan_layout_label(const PlanInput& in, const MicroBatchShape& micro) {
  const LayoutSpec& l = in.layout;
  std::string label =
      "TP" + std::to_string(l.tp) + " PP" + std::to_string(l.pp) + " DP" + std::to_string(l.dp);
  if (l.cp > 1) label += " CP" + std::to_string(l.cp) + (l.cp_comm == "ring" ? " ring" : "");
  if (l.ep > 1) label += " EP" + std::to_string(l.ep);
  if (l.sequence_parallel && l.tp > 1) label += " SP";
  label += ", " + std::to_string(micro.rows) + " x " + thousands(micro.row_tokens) + " tokens a micro-batch";
  label += ", recompute " + recompute_label(l.recompute) + ", offload " + offload_label(l.offload);
  if (l.activation_offload) label += ", activation offload";
  return label;
}

std::string plan_to_text(const Plan& p) {
  const PlanInput& in = p.input;
  std::string out;
  out += "loom plan: " + in.model_name + " on " + std::to_string(in.layout.world_size()) + " x " +
         in.gpu.name + " (" + gib(in.gpu.usable_bytes) + " GiB usable each; " + in.gpu_source + ")\n";
  out += "layout: " + plan_layout_label(in, p.micro) + "; " + std::to_string(p.micro.micro_batches) +
         " micro-batch(es) a step per DP rank\n\n";
  const StageMemory& m = p.memory.peak();
  out += "memory per GPU, stage " + std::to_string(m.stage) + " of " +
         std::to_string(p.memory.stages.size()) + (p.memory.stages.size() > 1 ? " (the fullest)" : "") +
         ": " + std::to_string(m.layers) + " layers, " + std::to_string(m.in_flight) +
         " micro-batch(es) in flight, " + thousands(m.params) + " parameters\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-32s %9s  %s\n", "term", "GiB", "what");
  out += line;
  bool outside_header = false;
  for (const MemoryTerm& t : m.terms) {
    if (!t.in_arenas && !outside_header) {
      std::snprintf(line, sizeof line, "  %-32s %9s  %s\n", "= arenas (max_mem_gib)",
                    gib(m.arena_bytes()).c_str(), "what the engine reports as its peak");
      out += line;
      outside_header = true;
    }
    std::snprintf(line, sizeof line, "  %-32s %9s  %s\n", t.name.c_str(), gib(t.bytes).c_str(),
                  t.what.c_str());
    out += line;
  }
  const double used = static_cast<double>(m.device_bytes()) / static_cast<double>(in.gpu.usable_bytes);
  std::snprintf(line, sizeof line, "  %-32s %9s  of %s GiB usable: %s (%.0f%%)\n", "= on the GPU",
                gib(m.device_bytes()).c_str(), gib(in.gpu.usable_bytes).c_str(),
                p.fits ? "fits" : "DOES NOT FIT", 100.0 * used);
  out += line;
  if (p.memory.stages.size() > 1) {
    out += "  every stage on the GPU:";
    for (const StageMemory& s : p.memory.stages)
      out += " " + std::to_string(s.stage) + ": " + gib(s.device_bytes()) + " GiB";
    out += "\n";
  }
  out += "\nhost memory per GPU's process, stage " + std::to_string(m.stage) +
         " (beyond its code and libraries; the host's size is not in the recipe)\n";
  for (const MemoryTerm& t : m.host_terms) {
    std::snprintf(line, sizeof line, "  %-32s %9s  %s\n", t.name.c_str(), gib(t.bytes).c_str(),
                  t.what.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-32s %9s\n", "= on the host", gib(m.host_bytes()).c_str());
  out += line;
  out += "\nstep time\n";
  std::snprintf(line, sizeof line, "  %-32s %9s  %s\n", "term", "ms", "what");
  out += line;
  for (const TimeTerm& t : p.time.terms) {
    std::snprintf(line, sizeof line, "  %-32s %9.1f  %s\n", t.name.c_str(), 1e3 * t.seconds, t.what.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-32s %9.1f  bubble %.1f%% of the pipeline\n", "= step",
                1e3 * p.time.step_s, 100.0 * p.time.bubble_fraction);
  out += line;
  out += "predicted: " + thousands(static_cast<int64_t>(p.time.tokens_per_s_per_gpu + 0.5)) +
         " tokens/s/GPU, MFU " + format("%.3f", p.time.mfu) + "\n";
  if (in.eval_every > 0)
    out += in.eval_rows > 0
               ? "eval (train.eval): " + thousands(in.eval_rows) + " rows every " +
                     std::to_string(in.eval_every) + " steps, about " + format("%.1f", p.time.eval_s) +
                     " s each, forward only, outside the step time and the measurement\n"
               : "eval (train.eval): every " + std::to_string(in.eval_every) +
                     " steps; its rows are not known before the run (a .jsonl: set max_rows to plan it)\n";
  return out;
}

namespace {

nlohmann::json constants_json(const PlanConstants& c) {
  return {{"loss_chunk_tokens", c.loss_chunk_tokens},
          {"cublas_workspace_bytes", c.cublas_workspace_bytes},
          {"adam_chunk_elements", c.adam_chunk_elements},
          {"adam_chunk_record_bytes", c.adam_chunk_record_bytes},
          {"cuda_context_bytes", c.cuda_context_bytes},
          {"sdpa_backward_workspace_dq_units", c.sdpa_backward_workspace_dq_units},
          {"sdpa_forward_workspace_bytes", c.sdpa_forward_workspace_bytes},
          {"nccl_bytes_per_communicator", c.nccl_bytes_per_communicator},
          {"allocator_slack_fraction", c.allocator_slack_fraction},
          {"sp_regather_in_backward", c.sp_regather_in_backward},
          {"gemm_forward_flops_per_s", c.gemm_forward_flops_per_s},
          {"gemm_backward_flops_per_s", c.gemm_backward_flops_per_s},
          {"fp8_gemm_forward_flops_per_s", c.fp8_gemm_forward_flops_per_s},
          {"fp8_gemm_backward_flops_per_s", c.fp8_gemm_backward_flops_per_s},
          {"fp8_block_gemm_flops_per_s", c.fp8_block_gemm_flops_per_s},
          {"lm_head_flops_per_s", c.lm_head_flops_per_s},
          {"attention_forward_flops_per_s", c.attention_forward_flops_per_s},
          {"attention_backward_flops_per_s", c.attention_backward_flops_per_s},
          {"elementwise_hbm_efficiency", c.elementwise_hbm_efficiency},
          {"optimizer_hbm_efficiency", c.optimizer_hbm_efficiency},
          {"nvlink_bytes_per_s", c.nvlink_bytes_per_s},
          {"internode_bytes_per_s_per_gpu", c.internode_bytes_per_s_per_gpu},
          {"pcie_bytes_per_s", c.pcie_bytes_per_s},
          {"activation_offload_bytes_per_s", c.activation_offload_bytes_per_s},
          {"host_optimizer_bytes_per_s", c.host_optimizer_bytes_per_s},
          {"comm_overlap", c.comm_overlap}};
}

}  // namespace

nlohmann::json plan_to_json(const Plan& p) {
  const PlanInput& in = p.input;
  const LayoutSpec& l = in.layout;
  nlohmann::json stages = nlohmann::json::array();
  for (const StageMemory& s : p.memory.stages) {
    nlohmann::json terms = nlohmann::json::array();
    for (const MemoryTerm& t : s.terms)
      terms.push_back({{"name", t.name}, {"bytes", t.bytes}, {"in_arenas", t.in_arenas}, {"what", t.what}});
    nlohmann::json host_terms = nlohmann::json::array();
    for (const MemoryTerm& t : s.host_terms)
      host_terms.push_back({{"name", t.name}, {"bytes", t.bytes}, {"what", t.what}});
    stages.push_back({{"stage", s.stage},
                      {"layers", s.layers},
                      {"in_flight", s.in_flight},
                      {"params", s.params},
                      {"arena_bytes", s.arena_bytes()},
                      {"device_bytes", s.device_bytes()},
                      {"terms", terms},
                      {"host_bytes", s.host_bytes()},
                      {"host_terms", host_terms}});
  }
  nlohmann::json time_terms = nlohmann::json::array();
  for (const TimeTerm& t : p.time.terms)
    time_terms.push_back({{"name", t.name}, {"seconds", t.seconds}, {"what", t.what}});
  const StageMemory& peak = p.memory.peak();
  return {
      {"model", in.model_name},
      {"matmul_params", in.model.matmul_params()},
      {"gpu",
       {{"name", in.gpu.name},
        {"source", in.gpu_source},
        {"usable_bytes", in.gpu.usable_bytes},
        {"peak_bf16_flops", in.gpu.peak_bf16_flops},
        {"hbm_bytes_per_s", in.gpu.hbm_bytes_per_s},
        {"multiprocessors", in.gpu.multiprocessors},
        {"count", l.world_size()},
        {"per_node", in.gpus_per_node}}},
      {"layout",
       {{"tp", l.tp},
        {"pp", l.pp},
        {"cp", l.cp},
        {"cp_comm", l.cp_comm},
        {"dp", l.dp},
        {"ep", l.ep},
        {"sequence_parallel", l.sequence_parallel && l.tp > 1},
        {"recompute", recompute_label(l.recompute)},
        {"offload_fraction", l.offload.enabled ? l.offload.optimizer_fraction : 0.0},
        {"activation_offload", l.activation_offload},
        {"label", plan_layout_label(in, p.micro)}}},
      {"micro_batch",
       {{"rows", p.micro.rows},
        {"tokens", p.micro.tokens},
        {"row_tokens", p.micro.row_tokens},
        {"micro_batches", p.micro.micro_batches}}},
      {"memory",
       {{"peak_stage", peak.stage},
        {"arena_bytes", peak.arena_bytes()},
        {"arena_gib", static_cast<double>(peak.arena_bytes()) / static_cast<double>(kGiB)},
        {"device_bytes", peak.device_bytes()},
        {"device_gib", static_cast<double>(peak.device_bytes()) / static_cast<double>(kGiB)},
        {"capacity_bytes", in.gpu.usable_bytes},
        {"fits", p.fits},
        {"attention_backward_by_row", in.attention_backward_by_row},
        {"stages", stages}}},
      {"time",
       {{"terms", time_terms},
        {"micro_batch_s", p.time.micro_batch_s},
        {"bubble_fraction", p.time.bubble_fraction},
        {"step_s", p.time.step_s},
        {"tokens_per_s_per_gpu", p.time.tokens_per_s_per_gpu},
        {"mfu", p.time.mfu}}},
      {"eval", {{"rows", in.eval_rows}, {"every", in.eval_every}, {"seconds_each", p.time.eval_s}}},
      {"constants", constants_json(in.constants)},
  };
}

}  // namespace loom
