// Validation of recipe files: the seed validates; bad recipes give the field path, what was
// found and expected, and the line; --set overrides; relative paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/sha256.h"
#include "recipe/recipe.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

using test::find_violation;
using test::line_of;
using test::read_text;
using test::seed_path;
using test::source_path;
using test::TempDir;
using test::write_text;

// A valid draft: the seed's model, workload and layout, nothing else.
const std::string kDraft = R"(schema_version: 1
model: Qwen3-32B
status: draft
workload:
  row_tokens: 8192
  global_batch: 128
  precision: bf16
layout:
  tp: 4
  pp: 2
  cp: 1
  dp: 1
  sequence_parallel: true
  max_tokens_per_gpu: 16384
  recompute: null
  offload: null
)";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "the test's text has no '" << from << "'";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

struct Validated {
  std::string path;
  std::vector<Violation> violations;
};

Validated validate_text(const TempDir& tmp, const std::string& text) {
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, text);
  return {path, recipe_validate(path)};
}

TEST(RecipeValidate, SeedRecipeValidates) {
  std::vector<Violation> violations = recipe_validate(seed_path());
  EXPECT_TRUE(violations.empty()) << violations_to_string(violations);
}

// The seed recipe is kept as the project was given it: its sha256 is the original's.
TEST(RecipeValidate, SeedRecipeIsTheOriginalByteForByte) {
  EXPECT_EQ(sha256_file(seed_path()), "2b379b25335fce5bff036c4bdb2edd715e1592b720d2fb40eed45a8aee8310fb");
}

TEST(RecipeValidate, TinyRecipeAndDraftValidate) {
  for (const char* recipe : {"recipes/tiny/qwen3-tiny-cpu.yaml", "recipes/tiny/llama-tiny-cpu.yaml",
                             "recipes/tiny/qwen2-tiny-cpu.yaml"}) {
    std::vector<Violation> tiny = recipe_validate(source_path(recipe));
    EXPECT_TRUE(tiny.empty()) << recipe << ": " << violations_to_string(tiny);
  }
  TempDir tmp;
  Validated draft = validate_text(tmp, kDraft);
  EXPECT_TRUE(draft.violations.empty()) << violations_to_string(draft.violations);
}

// The example recipe of docs/interface.md (its first yaml block, a draft with a train block)
// validates as the page shows it.
TEST(RecipeValidate, InterfaceDocExampleValidates) {
  const std::string page = read_text(source_path("docs/interface.md"));
  const size_t begin = page.find("```yaml\n");
  ASSERT_NE(begin, std::string::npos) << "docs/interface.md has no yaml block";
  const size_t end = page.find("```", begin + 8);
  ASSERT_NE(end, std::string::npos);
  const std::string example = page.substr(begin + 8, end - begin - 8);
  EXPECT_NE(example.find("train:"), std::string::npos);
  TempDir tmp;
  Validated v = validate_text(tmp, example);
  EXPECT_TRUE(v.violations.empty()) << violations_to_string(v.violations);
}

// train.on_nonfinite (train/nonfinite.h): an enum, and a bound on the skips in a row.
TEST(RecipeValidate, OnNonfiniteIsAnEnumAndMaxConsecutiveSkipsAtLeastOne) {
  const std::string train = R"(schema_version: 1
model: Qwen3-32B
status: draft
workload: {row_tokens: 8192, global_batch: 128, precision: bf16}
layout: {tp: 4, pp: 2, cp: 1, dp: 1, sequence_parallel: true, max_tokens_per_gpu: 16384}
train:
  init: {hf_checkpoint: path/to/Qwen3-32B}
  data: {path: path/to/rows}
  steps: 20
  output_dir: runs/x
)";
  TempDir tmp;
  EXPECT_TRUE(validate_text(tmp, train + "  on_nonfinite: skip_step\n  max_consecutive_skips: 2\n")
                  .violations.empty());
  Validated v = validate_text(tmp, train + "  on_nonfinite: skip\n  max_consecutive_skips: 0\n");
  ASSERT_EQ(v.violations.size(), 2u) << violations_to_string(v.violations);
  EXPECT_EQ(v.violations[0].field, "train.on_nonfinite");
  EXPECT_EQ(v.violations[0].what, "found skip, expected one of stop, skip_step");
  EXPECT_EQ(v.violations[1].field, "train.max_consecutive_skips");
  EXPECT_EQ(v.violations[1].what, "found 0, expected an integer >= 1");
}

struct BadCase {
  const char* name;
  std::string from, to;  // the draft's text `from` becomes `to`; from "" appends `to`
  std::string field;     // the one violation's field path
  std::string what;      // its text, exactly
  std::string line_at;   // a text on the line it names; "" for no line
};

class BadRecipe : public ::testing::TestWithParam<BadCase> {};

// A second YAML document was once ignored: refused with the line it starts on (no field).
TEST(BadRecipeFile, ASecondDocumentIsRefused) {
  const std::string text = kDraft + "---\nmodel: Qwen3-8B\n";
  TempDir tmp;
  Validated v = validate_text(tmp, text);
  ASSERT_EQ(v.violations.size(), 1u) << violations_to_string(v.violations);
  EXPECT_EQ(v.violations[0].to_string(), v.path + ":" + std::to_string(line_of(text, "model: Qwen3-8B")) +
                                             ": found a second YAML document, expected one (a recipe is one "
                                             "document)");
}

// A stray ',' where a document starts (found by tests/fuzz) once hung yaml-cpp 0.7's LoadAll,
// which read it as empty documents for ever while its memory grew.
TEST(BadRecipeFile, AStrayCommaIsInvalidYaml) {
  TempDir tmp;
  for (const std::string& text : {std::string(","), std::string("# a comment\n  , a\n")}) {
    Validated v = validate_text(tmp, text);
    ASSERT_EQ(v.violations.size(), 1u) << violations_to_string(v.violations);
    EXPECT_EQ(v.violations[0].to_string(),
              v.path + ":" + std::to_string(line_of(text, ",")) + ": not valid YAML: column " +
                  std::to_string(text.find(',') - (text.rfind('\n', text.find(',')) + 1) + 1) +
                  " holds a character that cannot start a value");
  }
}

// A run writes into train.output_dir: a folder it reads from may not be it, hold it or lie in it.
TEST(BadRecipeFile, AnOutputDirThatOverlapsAnInputIsRefused) {
  const std::string train = R"(schema_version: 1
model: Qwen3-32B
status: draft
workload: {row_tokens: 8192, global_batch: 128, precision: bf16}
layout: {tp: 4, pp: 2, cp: 1, dp: 1, sequence_parallel: true, max_tokens_per_gpu: 16384}
train:
  init: {hf_checkpoint: path/to/Qwen3-32B}
  data: {path: path/to/rows}
  eval: {data: {path: path/to/heldout}, every: 5}
  steps: 20
)";
  TempDir tmp;
  const auto refusals = [&](const std::string& output_dir) {
    return validate_text(tmp, train + "  output_dir: " + output_dir + "\n").violations;
  };
  EXPECT_TRUE(refusals("path/to/run").empty()) << violations_to_string(refusals("path/to/run"));
  const std::string folder = tmp.path() + "/";
  std::vector<Violation> v = refusals("path/to/rows");
  ASSERT_EQ(v.size(), 1u) << violations_to_string(v);
  EXPECT_EQ(v[0].field, "train.output_dir, train.data.path");
  EXPECT_EQ(v[0].what,
            "found output_dir " + folder + "path/to/rows that is train.data.path " + folder +
                "path/to/rows, expected folders apart (a run writes its checkpoints, final/ and logs "
                "into output_dir)");
  v = refusals("path/to/heldout/../heldout/run");
  ASSERT_EQ(v.size(), 1u) << violations_to_string(v);
  EXPECT_EQ(v[0].field, "train.output_dir, train.eval.data.path");
  EXPECT_NE(v[0].what.find("that lies inside train.eval.data.path"), std::string::npos) << v[0].what;
  v = refusals("path");
  ASSERT_EQ(v.size(), 3u) << violations_to_string(v);
  EXPECT_EQ(v[2].field, "train.output_dir, train.init.hf_checkpoint");
  EXPECT_NE(v[2].what.find("that holds train.init.hf_checkpoint"), std::string::npos) << v[2].what;
}

TEST_P(BadRecipe, NamesFieldFoundExpectedAndLine) {
  const BadCase& c = GetParam();
  const std::string text = c.from.empty() ? kDraft + c.to : replaced(kDraft, c.from, c.to);
  TempDir tmp;
  Validated v = validate_text(tmp, text);
  ASSERT_EQ(v.violations.size(), 1u) << violations_to_string(v.violations);
  const Violation& got = v.violations[0];
  EXPECT_EQ(got.file, v.path);
  EXPECT_EQ(got.field, c.field);
  EXPECT_EQ(got.what, c.what);
  EXPECT_EQ(got.line, c.line_at.empty() ? 0 : line_of(text, c.line_at)) << got.to_string();
  EXPECT_EQ(got.to_string(),
            v.path + (got.line ? ":" + std::to_string(got.line) : "") + ": " + c.field + ": " + c.what);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadRecipe,
    ::testing::Values(
        BadCase{"word_for_int", "  tp: 4", "  tp: four", "layout.tp", "found four, expected an integer >= 1",
                "tp: four"},
        BadCase{"quoted_int", "  tp: 4", "  tp: '4'", "layout.tp",
                "found the quoted string '4', expected an integer >= 1", "tp: '4'"},
        BadCase{"below_min", "  dp: 1", "  dp: 0", "layout.dp", "found 0, expected an integer >= 1", "dp: 0"},
        BadCase{"null_not_allowed", "  cp: 1", "  cp: null", "layout.cp",
                "found null, expected an integer >= 1", "cp: null"},
        BadCase{"fraction_for_int", "row_tokens: 8192", "row_tokens: 8192.5", "workload.row_tokens",
                "found 8192.5, expected an integer in [1, 131072]", "row_tokens"},
        // Rows past 2^24 tokens once ended in a bare std::bad_alloc; loom trains rows up to 2^17.
        BadCase{"row_tokens_past_max", "row_tokens: 8192", "row_tokens: 2147483647", "workload.row_tokens",
                "found 2147483647, expected an integer in [1, 131072]", "row_tokens"},
        BadCase{"row_tokens_past_supported", "row_tokens: 8192", "row_tokens: 131073", "workload.row_tokens",
                "found 131073, expected an integer in [1, 131072]", "row_tokens"},
        BadCase{"yes_for_bool", "sequence_parallel: true", "sequence_parallel: yes",
                "layout.sequence_parallel", "found yes, expected true or false", "sequence_parallel"},
        BadCase{"enum", "precision: bf16", "precision: fp16", "workload.precision",
                "found fp16, expected one of bf16, fp32, fp8", "precision"},
        BadCase{"cp_comm_enum", "  cp: 1", "  cp: 1\n  cp_comm: p2p", "layout.cp_comm",
                "found p2p, expected one of all_gather, ring", "cp_comm: p2p"},
        BadCase{"version", "schema_version: 1", "schema_version: 2", "schema_version",
                "found 2, expected one of 1", "schema_version"},
        BadCase{"status", "status: draft", "status: done", "status",
                "found done, expected one of draft, measured, verified", "status"},
        BadCase{"list_for_map", "  recompute: null", "  recompute: [full]", "layout.recompute",
                "found a list of 1 items, expected a map with fields granularity, method, num_layers or null",
                "recompute"},
        BadCase{"nested_misspelling", "  sequence_parallel: true", "  sequence_paralel: true",
                "layout.sequence_paralel",
                "found an unknown key, expected a field of layout; did you mean 'sequence_parallel'?",
                "sequence_paralel"},
        BadCase{"top_level_misspelling", "", "modle: Qwen3-32B\n", "modle",
                "found an unknown key, expected a top-level field; did you mean 'model'?", "modle"},
        // A tag once made "!!str 4" an integer 4 here.
        BadCase{"explicit_tag", "  tp: 4", "  tp: !!str 4", "layout.tp",
                "found the explicit YAML tag tag:yaml.org,2002:str, expected a value without a tag",
                "tp: !!str"},
        BadCase{"duplicate_key", "  pp: 2\n", "  pp: 2\n  tp: 8\n", "layout.tp",
                "found the key a second time (first on line 9), expected each key once", "tp: 8"},
        BadCase{"bad_date", "", "result:\n  measured: 2026-13-01\n", "result.measured",
                "found 2026-13-01, expected a date (YYYY-MM-DD)", "measured"},
        BadCase{"window_length", "", "result:\n  window: [5]\n", "result.window",
                "found a list of 1 items, expected a list of 2 x an integer >= 1", "window"},
        BadCase{"window_order", "", "result:\n  window: [19, 5]\n", "result.window",
                "found [19, 5], expected first <= last", "window"},
        BadCase{"missing_required", "  max_tokens_per_gpu: 16384\n", "", "layout.max_tokens_per_gpu",
                "found nothing, expected an integer >= 1", "layout:"}),
    [](const ::testing::TestParamInfo<BadCase>& param) { return std::string(param.param.name); });

TEST(RecipeValidate, FarUnknownKeyListsTheKnownOnes) {
  TempDir tmp;
  Validated v = validate_text(tmp, kDraft + "zzzz: 1\n");
  ASSERT_EQ(v.violations.size(), 1u) << violations_to_string(v.violations);
  EXPECT_EQ(v.violations[0].field, "zzzz");
  EXPECT_EQ(
      v.violations[0].what.rfind("found an unknown key, expected one of schema_version, model, gpu,", 0), 0u)
      << v.violations[0].what;
  EXPECT_EQ(v.violations[0].what.find("did you mean"), std::string::npos);
}

TEST(RecipeValidate, ReportsEveryViolationAtOnceInOrder) {
  std::string text = replaced(kDraft, "  tp: 4", "  tp: four");
  text = replaced(text, "precision: bf16", "precision: fp16");
  text = replaced(text, "  offload: null", "  offlaod: null");
  text += "result:\n  measured: yesterday\n";
  TempDir tmp;
  Validated v = validate_text(tmp, text);
  ASSERT_EQ(v.violations.size(), 4u) << violations_to_string(v.violations);
  EXPECT_EQ(v.violations[0].field, "workload.precision");
  EXPECT_EQ(v.violations[0].line, line_of(text, "precision: fp16"));
  EXPECT_EQ(v.violations[1].field, "layout.tp");
  EXPECT_EQ(v.violations[1].line, line_of(text, "tp: four"));
  EXPECT_EQ(v.violations[2].field, "layout.offlaod");
  EXPECT_NE(v.violations[2].what.find("did you mean 'offload'?"), std::string::npos);
  EXPECT_EQ(v.violations[3].field, "result.measured");
  EXPECT_EQ(v.violations[3].line, line_of(text, "measured: yesterday"));
  // One line each, as `loom recipe validate` prints them.
  const std::string printed = violations_to_string(v.violations);
  EXPECT_EQ(std::count(printed.begin(), printed.end(), '\n'), 3);
}

TEST(RecipeValidate, NearlyEmptyRecipeListsWhatIsMissing) {
  TempDir tmp;
  Validated v = validate_text(tmp, "schema_version: 2\n");
  for (const char* field : {"schema_version", "model", "status", "workload", "layout"})
    EXPECT_NE(find_violation(v.violations, field), nullptr) << field << "\n"
                                                            << violations_to_string(v.violations);
  Validated list = validate_text(tmp, "- a list\n");
  ASSERT_EQ(list.violations.size(), 1u) << violations_to_string(list.violations);
  EXPECT_EQ(
      list.violations[0].what.rfind("found a list of 1 items, expected a map with fields schema_version,", 0),
      0u)
      << list.violations[0].what;
}

TEST(RecipeValidate, NotYamlNamesTheLine) {
  TempDir tmp;
  Validated v = validate_text(tmp, "schema_version: 1\nmodel: [Qwen3\nstatus: draft\n");
  ASSERT_EQ(v.violations.size(), 1u);
  EXPECT_GT(v.violations[0].line, 0);
  EXPECT_EQ(v.violations[0].what.rfind("not valid YAML", 0), 0u) << v.violations[0].what;
  EXPECT_EQ(recipe_validate(tmp.file("absent.yaml"))[0].what, "cannot open the recipe file");
}

TEST(RecipeValidate, MeasuredStatusNeedsTheMeasurementBlocks) {
  TempDir tmp;
  Validated v = validate_text(tmp, replaced(kDraft, "status: draft", "status: measured"));
  for (const char* field :
       {"gpu", "author", "stack", "result", "correctness", "env", "patches", "run", "notes", "workload.rows",
        "workload.dataset", "layout.label", "layout.rows_per_microbatch"}) {
    const Violation* got = find_violation(v.violations, field);
    ASSERT_NE(got, nullptr) << field << " not reported in\n" << violations_to_string(v.violations);
    EXPECT_EQ(got->what.rfind("found nothing, expected ", 0), 0u) << got->what;
    EXPECT_NE(got->what.find("(required when status is measured)"), std::string::npos) << got->what;
  }
  EXPECT_EQ(find_violation(v.violations, "train"), nullptr) << "train is required by loom train only";
}

// Changes to the seed (status verified), each breaking one field of its measurement.
struct SeedCase {
  const char* name;
  std::string from, to;
  std::string field;
  std::string what_has;  // a part of the violation's text
  std::string line_at;
};

class BadSeed : public ::testing::TestWithParam<SeedCase> {};

TEST_P(BadSeed, NamesFieldAndLine) {
  const SeedCase& c = GetParam();
  const std::string text = replaced(read_text(seed_path()), c.from, c.to);
  TempDir tmp;
  Validated v = validate_text(tmp, text);
  ASSERT_EQ(v.violations.size(), 1u) << violations_to_string(v.violations);
  EXPECT_EQ(v.violations[0].field, c.field);
  EXPECT_NE(v.violations[0].what.find(c.what_has), std::string::npos) << v.violations[0].what;
  EXPECT_EQ(v.violations[0].line, line_of(text, c.line_at)) << v.violations[0].to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadSeed,
    ::testing::Values(
        SeedCase{"url", "  url: https://arxiv.org", "  url: arxiv.org", "author.url",
                 "found arxiv.org/abs/2610.17528, expected an http(s) URL", "url: arxiv.org"},
        SeedCase{"sha256", "rows_sha256: 8f76b822", "rows_sha256: 8f76b82", "workload.dataset.rows_sha256",
                 "expected a sha256 (64 lowercase hex digits)", "rows_sha256"},
        SeedCase{"list_item_date", "    date: 2026-10-11", "    date: 2026-10-32",
                 "correctness.component_tests[0].date", "found 2026-10-32, expected a date (YYYY-MM-DD)",
                 "date: 2026-10-32"},
        SeedCase{"list_item_missing", "    gpu: H200\n", "", "correctness.component_tests[0].gpu",
                 "found nothing, expected a string", "  - test:"},
        SeedCase{"mfu_bounds", "  mfu: 0.4269", "  mfu: 42.69", "result.mfu",
                 "found 42.69, expected a number in [0, 1]", "mfu: 42.69"},
        SeedCase{"gpu_count", "  count: 8", "  count: 16",
                 "layout.tp, layout.pp, layout.cp, layout.dp, gpu.count",
                 "found tp·pp·cp·dp = 4·2·1·1 = 8, expected gpu.count = 16", "  tp: 4"},
        SeedCase{"window_tokens", "window_tokens: 15728640", "window_tokens: 15728641",
                 "result.window_tokens, result.window, workload.global_batch, workload.row_tokens",
                 "expected (last - first + 1) · global_batch · row_tokens = 15728640", "window_tokens"},
        SeedCase{"build_row_tokens", "      row_tokens: 8192", "      row_tokens: 4096",
                 "workload.dataset.build.row_tokens, workload.row_tokens",
                 "expected workload.row_tokens = 8192", "      row_tokens: 4096"},
        SeedCase{"env_value", "  TORCHINDUCTOR_COMPILE_THREADS: '1'", "  TORCHINDUCTOR_COMPILE_THREADS: [1]",
                 "env.TORCHINDUCTOR_COMPILE_THREADS", "expected a string", "TORCHINDUCTOR_COMPILE_THREADS"}),
    [](const ::testing::TestParamInfo<SeedCase>& param) { return std::string(param.param.name); });

// recipe_load throws one InputError holding every violation; its message.
std::string load_error(const std::string& path, const std::vector<std::string>& overrides,
                       RecipeUse use = RecipeUse::inspect) {
  try {
    recipe_load(path, overrides, use);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// train.comm_timeout_s (train/rank_setup.h): a number of seconds in (0, 86400], 300 when
// absent; a bad value is refused (InputError: exit 2) naming the field, and its line when
// it is in the file.
TEST(RecipeLoad, CommTimeoutDefaultsTo300AndMustBePositive) {
  TempDir tmp;
  const std::string tiny = read_text(source_path("recipes/tiny/qwen3-tiny-cpu.yaml"));
  write_text(tmp.file("config.json"), read_text(source_path("recipes/tiny/config.json")));
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, tiny);
  EXPECT_DOUBLE_EQ(recipe_load(path, {}, RecipeUse::inspect).train.comm_timeout_s, 300);
  EXPECT_DOUBLE_EQ(recipe_load(path, {"train.comm_timeout_s=2.5"}, RecipeUse::inspect).train.comm_timeout_s,
                   2.5);
  for (const char* bad : {"0", "-1", "soon", "86401"}) {
    const std::string text =
        replaced(tiny, "train:\n", "train:\n  comm_timeout_s: " + std::string(bad) + "\n");
    write_text(path, text);
    EXPECT_EQ(load_error(path, {}), path + ":" + std::to_string(line_of(text, "comm_timeout_s:")) +
                                        ": train.comm_timeout_s: found " + bad +
                                        ", expected a number in (0, 86400]")
        << bad;
  }
  write_text(path, tiny);
  EXPECT_EQ(load_error(path, {"train.comm_timeout_s=0"}),
            path + ": train.comm_timeout_s: found 0, expected a number in (0, 86400]");
}

// train.fp8_stats_every (model/linear.h Fp8Stats): 100 when absent, 0 turns it off, a negative
// or non-integer value is refused naming the field.
TEST(RecipeLoad, Fp8StatsEveryDefaultsTo100AndIsACountOfSteps) {
  TempDir tmp;
  write_text(tmp.file("config.json"), read_text(source_path("recipes/tiny/config.json")));
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, read_text(source_path("recipes/tiny/qwen3-tiny-cpu.yaml")));
  EXPECT_EQ(recipe_load(path, {}, RecipeUse::inspect).train.fp8_stats_every, 100);
  EXPECT_EQ(recipe_load(path, {"train.fp8_stats_every=0"}, RecipeUse::inspect).train.fp8_stats_every, 0);
  for (const char* bad : {"-1", "often", "2.5"}) {
    const std::string error = load_error(path, {std::string("train.fp8_stats_every=") + bad});
    EXPECT_NE(error.find("train.fp8_stats_every: found " + std::string(bad)), std::string::npos) << error;
  }
}

// layout.activation_offload: false when absent, a bool, and refused (naming the fields) with no
// full recompute to offload the inputs of.
TEST(RecipeLoad, ActivationOffloadIsABoolThatNeedsFullRecompute) {
  TempDir tmp;
  write_text(tmp.file("config.json"), read_text(source_path("recipes/tiny/config.json")));
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, read_text(source_path("recipes/tiny/qwen3-tiny-cpu.yaml")));
  EXPECT_FALSE(recipe_load(path, {}, RecipeUse::inspect).layout.activation_offload);
  const std::vector<std::string> full{"layout.recompute={granularity: full, method: uniform, num_layers: 1}",
                                      "layout.activation_offload=true"};
  EXPECT_TRUE(recipe_load(path, full, RecipeUse::inspect).layout.activation_offload);
  const std::string error = load_error(path, {"layout.recompute=null", "layout.activation_offload=true"});
  EXPECT_NE(
      error.find("layout.activation_offload, layout.recompute.granularity: found activation_offload true "
                 "with recompute null"),
      std::string::npos)
      << error;
  EXPECT_NE(
      load_error(path, {"layout.activation_offload=often"}).find("layout.activation_offload: found often"),
      std::string::npos);
}

TEST(RecipeOverrides, SetTypedValues) {
  TempDir tmp;
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, kDraft);
  Recipe r = recipe_load(path,
                         {"layout.tp=8", "layout.sequence_parallel=false", "workload.precision=fp8",
                          "layout.layer_split=[30,34]", "layout.recompute={granularity: selective}",
                          "gpu.usd_per_gpu_hour=7.5", "env.NCCL_DEBUG=INFO"},
                         RecipeUse::inspect);
  EXPECT_EQ(r.layout.tp, 8);
  EXPECT_FALSE(r.layout.sequence_parallel);
  EXPECT_EQ(r.workload.precision, "fp8");
  EXPECT_EQ(r.layout.layer_split, (std::vector<int64_t>{30, 34}));
  EXPECT_TRUE(r.layout.recompute.enabled);
  EXPECT_EQ(r.layout.recompute.granularity, "selective");
  EXPECT_DOUBLE_EQ(r.usd_per_gpu_hour, 7.5);
  EXPECT_EQ(r.document["env"]["NCCL_DEBUG"].as<std::string>(), "INFO");
  EXPECT_EQ(r.document["layout"]["tp"].as<int>(), 8) << "result.yaml writes the overridden document";
}

TEST(RecipeOverrides, NullOnANullableFieldKeepsNull) {
  TempDir tmp;
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, replaced(kDraft, "  recompute: null", "  recompute: {granularity: full}"));
  EXPECT_TRUE(recipe_load(path, {}, RecipeUse::inspect).layout.recompute.enabled);
  Recipe r = recipe_load(path, {"layout.recompute=null"}, RecipeUse::inspect);
  EXPECT_FALSE(r.layout.recompute.enabled);
  EXPECT_TRUE(r.document["layout"]["recompute"].IsNull());
}

TEST(RecipeOverrides, BadOverridesAreViolationsWithoutALine) {
  TempDir tmp;
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, kDraft);
  EXPECT_NE(
      load_error(path, {"layout.tp=eight"}).find(path + ": layout.tp: found eight, expected an integer >= 1"),
      std::string::npos);
  EXPECT_EQ(
      load_error(path, {"layout.tpp=2"}),
      path +
          ": --set layout.tpp=2: found the unknown field layout.tpp, expected a field of layout; did you "
          "mean 'layout.tp'?");
  EXPECT_EQ(load_error(path, {"layout.tp"}),
            path + ": --set layout.tp: found no field path, expected FIELD.PATH=VALUE");
  EXPECT_NE(load_error(path, {"layout.tp.x=1"}).find("expected a path ending at layout.tp"),
            std::string::npos);
  EXPECT_NE(load_error(path, {"layuot.tp=1"}).find("did you mean 'layout'?"), std::string::npos);
  // null removes a field that cannot be null: then it is missing.
  EXPECT_NE(load_error(path, {"layout.tp=null"}).find("layout.tp: found nothing, expected an integer >= 1"),
            std::string::npos);
  // Several at once, one per line.
  const std::string both = load_error(path, {"layout.tp=eight", "layout.dp=zero"});
  EXPECT_NE(both.find("layout.tp: found eight"), std::string::npos) << both;
  EXPECT_NE(both.find("\n"), std::string::npos) << both;
  EXPECT_NE(both.find("layout.dp: found zero"), std::string::npos) << both;
}

TEST(RecipeOverrides, OverrideIsCheckedAgainstTheLayoutRules) {
  const std::string error = load_error(seed_path(), {"layout.tp=8"});
  EXPECT_NE(
      error.find("layout.tp, layout.pp, layout.cp, layout.dp, gpu.count: found tp·pp·cp·dp = 8·2·1·1 = 16, "
                 "expected gpu.count = 8"),
      std::string::npos)
      << error;
  EXPECT_EQ(recipe_load(seed_path(), {"layout.tp=8", "layout.pp=1"}, RecipeUse::inspect).layout.world_size(),
            8);
}

TEST(RecipeLoad, TrainNeedsTheTrainBlock) {
  TempDir tmp;
  const std::string path = tmp.file("recipe.yaml");
  write_text(path, kDraft);
  EXPECT_EQ(
      load_error(path, {}, RecipeUse::train),
      path +
          ": train: found nothing, expected a map with fields device, seed, init, data, steps, optimizer, "
          "lora, output_dir, checkpoint, eval, reference, on_nonfinite, max_consecutive_skips, "
          "comm_timeout_s, "
          "fp8_stats_every (loom train needs it)");
}

TEST(RecipeLoad, RelativePathsResolveAgainstTheRecipesFolder) {
  TempDir tmp;
  write_text(tmp.file("model/config.json"), read_text(source_path("recipes/tiny/config.json")));
  const std::string path = tmp.file("recipes/run/tiny.yaml");
  write_text(path, R"(schema_version: 1
model: qwen3-tiny
status: draft
workload: {row_tokens: 64, global_batch: 8, precision: fp32}
layout: {tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 512}
train:
  device: cpu
  init: {random: {config: ../../model/config.json}}
  data: {path: rows.jsonl}
  steps: 4
  output_dir: out/run
)");
  Recipe r = recipe_load(path, {}, RecipeUse::train);
  namespace fs = std::filesystem;
  EXPECT_EQ(fs::path(r.train.init_random_config), fs::path(tmp.file("model/config.json")));
  EXPECT_EQ(fs::path(r.train.data_path), fs::path(tmp.file("recipes/run/rows.jsonl")));
  EXPECT_EQ(fs::path(r.train.output_dir), fs::path(tmp.file("recipes/run/out/run")));
  EXPECT_EQ(r.model_config.hidden_size, 64) << "the architecture comes from the resolved config.json";
  // Absolute paths stay as written; --set paths resolve against the recipe too.
  Recipe s =
      recipe_load(path, {"train.data.path=/data/rows.jsonl", "train.output_dir=elsewhere"}, RecipeUse::train);
  EXPECT_EQ(s.train.data_path, "/data/rows.jsonl");
  EXPECT_EQ(fs::path(s.train.output_dir), fs::path(tmp.file("recipes/run/elsewhere")));
  // The document keeps what was written, for result.yaml.
  EXPECT_EQ(r.document["train"]["data"]["path"].as<std::string>(), "rows.jsonl");
}

TEST(RecipeDocument, ToYamlReadsBackTheSameAndValidates) {
  YAML::Node seed = YAML::LoadFile(seed_path());
  const std::string text = recipe_document_to_yaml(seed);
  YAML::Node back = YAML::Load(text);
  EXPECT_EQ(back["stack"]["cuda"].Tag(), "!") << "'12.9' stays a quoted string";
  EXPECT_EQ(back["stack"]["cuda"].Scalar(), "12.9");
  EXPECT_EQ(back["run"].Scalar(), seed["run"].Scalar());
  EXPECT_EQ(back["notes"].Scalar(), seed["notes"].Scalar());
  EXPECT_TRUE(back["layout"]["layer_split"].IsNull());
  EXPECT_NE(text.find("window: [5, 19]"), std::string::npos);
  EXPECT_NE(text.find("layer_split: null"), std::string::npos);
  EXPECT_EQ(back["env"]["NCCL_NVLS_ENABLE"].Scalar(), seed["env"]["NCCL_NVLS_ENABLE"].Scalar());
  TempDir tmp;
  write_text(tmp.file("seed.yaml"), text);
  std::vector<Violation> violations = recipe_validate(tmp.file("seed.yaml"));
  EXPECT_TRUE(violations.empty()) << violations_to_string(violations);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

TEST(RecipeDocument, MovedRewritesRelativePathFieldsForTheNewFolder) {
  const YAML::Node doc = YAML::Load(
      "model: qwen3-tiny\nworkload: {dataset: {build: {builder: data/build.py}}}\n"
      "train: {init: {random: {config: config.json}}, data: {path: /data/rows.jsonl}, output_dir: "
      "../../runs/tiny}\n");
  const YAML::Node near = recipe_document_moved(doc, "/work/main/recipes/tiny", "/work/main/runs/tiny");
  EXPECT_EQ(near["train"]["init"]["random"]["config"].Scalar(), "../../recipes/tiny/config.json");
  EXPECT_EQ(near["train"]["data"]["path"].Scalar(), "/data/rows.jsonl") << "absolute paths are kept";
  EXPECT_EQ(near["train"]["output_dir"].Scalar(), ".");
  EXPECT_EQ(near["workload"]["dataset"]["build"]["builder"].Scalar(), "data/build.py") << "not a path field";
  // Folders that share only the root: absolute, not a climb to it.
  const YAML::Node far = recipe_document_moved(doc, "/work/main/recipes/tiny", "/tmp/run");
  EXPECT_EQ(far["train"]["init"]["random"]["config"].Scalar(), "/work/main/recipes/tiny/config.json");
  EXPECT_EQ(doc["train"]["init"]["random"]["config"].Scalar(), "config.json") << "the input is not changed";
}

}  // namespace
}  // namespace loom
