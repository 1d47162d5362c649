// `loom recipe validate`, `loom recipe render` and `loom train`'s refusal of a bad layout,
// through the loom binary: exit codes, one violation per line, outputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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
