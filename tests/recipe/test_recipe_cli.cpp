// `loom recipe validate`, `loom recipe render` and `loom train`'s refusal of a bad layout,
// through the loom binary: exit codes, one violation per line, outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "recipe_test_util.h"
#include "support/run_binary.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::read_text;
using test::source_path;
using test::TempDir;
using test::write_text;

test::BinaryRun loom(const TempDir& tmp, const std::string& args) {
  return test::run_binary(LOOM_BINARY, args, tmp);
}

// The tiny CPU recipe with absolute paths, its output in the scratch folder.
std::string tiny_recipe(const TempDir& tmp, const std::string& layout) {
  const std::string path = tmp.file("tiny.yaml");
  write_text(path,
             "schema_version: 1\nmodel: qwen3-tiny\nstatus: draft\n"
             "workload: {row_tokens: 64, global_batch: 8, precision: fp32}\n"
             "layout: " +
                 layout +
                 "\n"
                 "train:\n  device: cpu\n  init: {random: {config: " +
                 source_path("recipes/tiny/config.json") +
                 "}}\n  data: {path: " + source_path("recipes/tiny/rows.jsonl") +
                 "}\n  steps: 2\n"
                 "  output_dir: " +
                 tmp.file("run") + "\n");
  return path;
}

TEST(RecipeCli, ValidateSeedExitsZero) {
  TempDir tmp;
  test::BinaryRun r = loom(tmp, "recipe validate " + test::seed_path());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, test::seed_path() + ": valid\n");
}

TEST(RecipeCli, ValidatePrintsEveryViolationOnItsOwnLineAndExitsTwo) {
  TempDir tmp;
  const std::string path = tmp.file("bad.yaml");
  write_text(path,
             "schema_version: 1\nmodel: Qwen3-32B\nstatus: draft\nworkload: {row_tokens: 8192, "
             "global_batch: 128, precision: fp16}\nlayout:\n  tp: 3\n  pp: 2\n  cp: 1\n  dp: 1\n"
             "  max_tokens_per_gpu: 4096\n  sequence_paralel: true\n");
  test::BinaryRun r = loom(tmp, "recipe validate " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(path + ":4: workload.precision: found fp16, expected one of bf16, fp32, fp8\n"),
            std::string::npos)
      << r.err;
  EXPECT_NE(
      r.err.find(path + ":11: layout.sequence_paralel: found an unknown key, expected a field of layout; did "
                        "you mean 'sequence_parallel'?\n"),
      std::string::npos)
      << r.err;
  EXPECT_NE(
      r.err.find(path + ":6: layout.tp: found 3, expected a divisor of the model's 64 attention heads\n"),
      std::string::npos)
      << r.err;
  EXPECT_NE(
      r.err.find(path + ":10: layout.max_tokens_per_gpu, workload.row_tokens: found max_tokens_per_gpu 4096"),
      std::string::npos)
      << r.err;
  // Every line of stderr is one violation of this file.
  size_t start = 0;
  int lines = 0;
  while (start < r.err.size()) {
    EXPECT_EQ(r.err.compare(start, path.size() + 1, path + ":"), 0) << r.err.substr(start, 120);
    start = r.err.find('\n', start) + 1;
    ++lines;
  }
  EXPECT_GE(lines, 5);
}

TEST(RecipeCli, TrainRefusesABadLayoutBeforeAnyWorkNamingTheFields) {
  TempDir tmp;
  const std::string path = tiny_recipe(tmp, "{tp: 3, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 32}");
  test::BinaryRun r = loom(tmp, "train " + path);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find(path + ":5: layout.tp: found 3, expected a divisor of the model's 4 attention heads"),
            std::string::npos)
      << r.err;
  EXPECT_NE(
      r.err.find("layout.max_tokens_per_gpu, workload.row_tokens: found max_tokens_per_gpu 32, expected at "
                 "least row_tokens = 64"),
      std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("run"))) << "nothing is written for a recipe that does not validate";

  const std::string good = tiny_recipe(tmp, "{tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}");
  test::BinaryRun sp = loom(tmp, "train " + good + " --set layout.sequence_parallel=true --set layout.pp=3");
  EXPECT_EQ(sp.code, 2) << sp.err;
  EXPECT_NE(
      sp.err.find(
          "layout.sequence_parallel, layout.tp: found sequence_parallel true with tp = 1, expected tp > 1"),
      std::string::npos)
      << sp.err;
  EXPECT_NE(
      sp.err.find("layout.pp, layout.layer_split: found pp = 3 with layer_split null, expected a divisor of "
                  "the model's 2 layers, or a layer_split"),
      std::string::npos)
      << sp.err;
}

// The violations of `path` on stderr, one a line, each from the file's name on ("loom: "
// goes before the first of an error).
std::vector<std::string> violation_lines(const std::string& err, const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < err.size()) {
    size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(start, end - start);
    const size_t at = line.find(path + ":");
    if (at != std::string::npos) out.push_back(line.substr(at));
    start = end + 1;
  }
  return out;
}

// A recipe of the tiny Llama, its config.json's FFN size the number after '#' in `name`
// (default 128), the train block's device and more in `train`.
std::string llama_recipe(const TempDir& tmp, const std::string& name, const std::string& workload,
                         const std::string& layout, const std::string& train) {
  std::string config = read_text(source_path("recipes/tiny/llama-config.json"));
  const std::string ffn = "\"intermediate_size\": 128";
  const size_t at = config.find(ffn);
  EXPECT_NE(at, std::string::npos);
  const size_t hash = name.find('#');
  const std::string ffn_size = hash == std::string::npos ? "128" : name.substr(hash + 1);
  config.replace(at, ffn.size(), "\"intermediate_size\": " + ffn_size);
  const std::string stem = name.substr(0, hash);
  write_text(tmp.file(stem + "-config.json"), config);
  const std::string path = tmp.file(stem + ".yaml");
  write_text(path, "schema_version: 1\nmodel: llama-tiny\nstatus: draft\nworkload: " + workload +
                       "\nlayout: " + layout +
                       "\ntrain:\n  init: {random: {config: " + tmp.file(stem + "-config.json") +
                       "}}\n  data: {path: " + source_path("recipes/tiny/rows.jsonl") +
                       "}\n  steps: 2\n  output_dir: " + tmp.file(stem + "-run") + "\n" + train);
  return path;
}

// One set of rules (recipe/rules.h): validate, plan and train refuse a recipe with the same
// violations, line for line, exit 2, before any work. The recipes break every rule but the
// FP8 ones (which need FP8), the FP8 GEMMs' multiple of 16 (a Llama with an FFN of 200:
// down's k), and block scaling's 128-blocks on cuda (hidden 64).
TEST(RecipeCli, ValidatePlanAndTrainReportTheSameViolations) {
  TempDir tmp;
  const struct {
    std::string path;
    std::vector<std::string> expected;
  } cases[] = {
      {llama_recipe(tmp, "many", "{row_tokens: 64, global_batch: 8, precision: bf16, fp8: {scaling: tensor}}",
                    "{tp: 3, pp: 1, cp: 2, dp: 3, ep: 2, max_tokens_per_gpu: 16}",
                    "  device: cpu\n  checkpoint: {every: 1, keep: 1, keep_best: true}\n"),
       {":5: layout.tp: found 3, expected a divisor of the model's 4 attention heads",
        ":5: layout.tp: found 3, expected a divisor of the model's 2 KV heads or a multiple of it",
        ":5: layout.tp: found 3, expected a divisor of the model's FFN size 128",
        ":5: layout.tp: found 3, expected a divisor of the model's vocabulary of 256",
        ":5: layout.max_tokens_per_gpu, workload.row_tokens: found max_tokens_per_gpu 16 · cp 2 = 32",
        ":5: layout.cp, layout.ep: found cp = 2 with ep = 2, expected ep = 1",
        ":4: workload.global_batch, layout.dp: found 8 rows, expected a multiple of dp = 3",
        ":5: layout.ep: found 2, expected 1",
        ":4: workload.precision, train.device: found bf16 on train.device cpu, expected fp32",
        ":4: workload.fp8, workload.precision: found a workload.fp8 block with workload.precision \"bf16\"",
        ":12: train.checkpoint.keep_best, train.eval: found keep_best true with no train.eval"}},
      {llama_recipe(tmp, "ffn#200", "{row_tokens: 64, global_batch: 8, precision: fp8}",
                    "{tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}", "  device: cuda\n"),
       {":4: workload.precision, train.device: found FP8 linear layers on train.device cuda with a TP rank's "
        "intermediate_size = 200, expected multiples of 16"}},
      {llama_recipe(tmp, "block", "{row_tokens: 128, global_batch: 8, precision: fp8, fp8: {scaling: block}}",
                    "{tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}", "  device: cuda\n"),
       {":4: workload.fp8.scaling, train.device: found block scaling on train.device cuda with a TP rank's "
        "hidden_size = 64 and q heads · head_dim = 64, expected multiples of 128"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    const test::BinaryRun validate = loom(tmp, "recipe validate " + c.path);
    const test::BinaryRun plan = loom(tmp, "plan " + c.path);
    const test::BinaryRun train = loom(tmp, "train " + c.path);
    EXPECT_EQ(validate.code, 2) << validate.err;
    EXPECT_EQ(plan.code, 2) << plan.err;
    EXPECT_EQ(train.code, 2) << train.err;
    const std::vector<std::string> lines = violation_lines(validate.err, c.path);
    EXPECT_EQ(lines.size(), c.expected.size()) << validate.err;
    for (const std::string& expected : c.expected)
      EXPECT_TRUE(std::any_of(lines.begin(), lines.end(),
                              [&](const std::string& l) { return l.rfind(c.path + expected, 0) == 0; }))
          << expected << "\nin\n"
          << validate.err;
    EXPECT_EQ(violation_lines(plan.err, c.path), lines) << plan.err;
    EXPECT_EQ(violation_lines(train.err, c.path), lines) << train.err;
    EXPECT_EQ(plan.out, "");
  }
  EXPECT_FALSE(fs::exists(tmp.file("many-run")));
  EXPECT_FALSE(fs::exists(tmp.file("ffn-run")));
  EXPECT_FALSE(fs::exists(tmp.file("block-run")));
}

// The FFN of 200 is what the rule refuses: 208 (13 · 16) validates, and 200 on the CPU,
// which emulates FP8 at any width.
TEST(RecipeCli, AnFfnOf200IsRefusedInFp8OnCudaAlone) {
  TempDir tmp;
  const std::string fits =
      llama_recipe(tmp, "ffn#208", "{row_tokens: 64, global_batch: 8, precision: fp8}",
                   "{tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}", "  device: cuda\n");
  test::BinaryRun r = loom(tmp, "recipe validate " + fits);
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string cpu =
      llama_recipe(tmp, "cpu#200", "{row_tokens: 64, global_batch: 8, precision: fp8}",
                   "{tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}", "  device: cpu\n");
  r = loom(tmp, "recipe validate " + cpu);
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST(RecipeCli, RenderWritesThePage) {
  TempDir tmp;
  write_text(tmp.file("run/metrics.jsonl"),
             "{\"step\": 1, \"loss\": 5.5, \"step_time_s\": 0.5}\n{\"step\": 2, \"loss\": 5.1, "
             "\"step_time_s\": 0.4}\n");
  const std::string out = tmp.file("page/seed.html");
  fs::create_directories(tmp.file("page"));
  test::BinaryRun html = loom(tmp, "recipe render " + test::seed_path() + " --format html --out " + out +
                                       " --run " + tmp.file("run"));
  EXPECT_EQ(html.code, 0) << html.err;
  EXPECT_EQ(html.out, "");
  const std::string page = read_text(out);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("2,200.16"), std::string::npos);
  EXPECT_NE(page.find("aria-label=\"Loss per step\""), std::string::npos);
  EXPECT_NE(page.find("From " + tmp.file("run") + "/metrics.jsonl, 2 steps"), std::string::npos);
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  test::BinaryRun md = loom(tmp, "recipe render " + test::seed_path() + " --format md");
  EXPECT_EQ(md.code, 0) << md.err;
  EXPECT_EQ(md.out.rfind("# Training Qwen3-32B on H200\n", 0), 0u);

  EXPECT_EQ(loom(tmp, "recipe render " + test::seed_path() + " --format pdf").code, 2);
  EXPECT_EQ(loom(tmp, "recipe render " + test::seed_path() + " --run " + tmp.file("no-run")).code, 2);

  // A recipe that does not validate is not rendered.
  write_text(tmp.file("bad.yaml"), "schema_version: 2\n");
  test::BinaryRun bad = loom(tmp, "recipe render " + tmp.file("bad.yaml"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("schema_version: found 2"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace loom
