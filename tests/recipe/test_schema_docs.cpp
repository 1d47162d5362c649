// schema/recipe.schema.yaml documents every field of the seed recipe and the train block,
// and its required-by-status rules are docs/interface.md's.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>
#include <vector>

#include "recipe/schema.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

// Walks a document alongside its schema; every key must have a schema entry with a doc.
void expect_documented(const YAML::Node& node, const SchemaField& field, const std::string& path, int* keys) {
  if (node.IsMap() && field.type == "map") {
    for (const auto& item : node) {
      const std::string key = item.first.Scalar();
      const std::string child_path = path.empty() ? key : path + "." + key;
      const SchemaField* child = field.field(key);
      ASSERT_NE(child, nullptr) << child_path << " has no schema entry";
      EXPECT_FALSE(child->doc.empty()) << child_path << " has no doc";
      EXPECT_FALSE(child->type.empty()) << child_path << " has no type";
      ++*keys;
      expect_documented(item.second, *child, child_path, keys);
    }
  } else if (node.IsMap() && field.type == "dict") {
    for (const auto& item : node)
      expect_documented(item.second, *field.element, path + "." + item.first.Scalar(), keys);
  } else if (node.IsSequence() && field.type == "list") {
    for (size_t i = 0; i < node.size(); ++i)
      expect_documented(node[i], *field.element, path + "[" + std::to_string(i) + "]", keys);
  }
}

TEST(SchemaDocs, EveryFieldOfTheSeedIsDocumented) {
  const SchemaField& schema = recipe_schema();
  int keys = 0;
  expect_documented(YAML::LoadFile(test::seed_path()), schema, "", &keys);
  EXPECT_GT(keys, 100) << "the walk saw too few keys to have covered the seed";
}

// Every named field of the schema (the train block included) has a doc; numbers that have
// units say them.
void expect_all_documented(const SchemaField& field, const std::string& path,
                           std::vector<std::string>* seen) {
  for (const SchemaField& child : field.fields) {
    const std::string child_path = path.empty() ? child.name : path + "." + child.name;
    seen->push_back(child_path);
    EXPECT_FALSE(child.doc.empty()) << child_path << " has no doc";
    expect_all_documented(child, child_path, seen);
  }
  if (field.element) expect_all_documented(*field.element, path + "[]", seen);
}

TEST(SchemaDocs, EverySchemaFieldIncludingTheTrainBlockHasADoc) {
  std::vector<std::string> seen;
  expect_all_documented(recipe_schema(), "", &seen);
  // docs/interface.md's train block, field by field.
  for (const char* path : {"train",
                           "train.device",
                           "train.seed",
                           "train.init",
                           "train.init.hf_checkpoint",
                           "train.init.random",
                           "train.init.random.config",
                           "train.data",
                           "train.data.path",
                           "train.steps",
                           "train.optimizer",
                           "train.optimizer.lr",
                           "train.optimizer.min_lr",
                           "train.optimizer.decay",
                           "train.optimizer.warmup_fraction",
                           "train.optimizer.weight_decay",
                           "train.optimizer.beta1",
                           "train.optimizer.beta2",
                           "train.optimizer.eps",
                           "train.optimizer.clip_grad",
                           "train.output_dir",
                           "train.checkpoint",
                           "train.checkpoint.every",
                           "train.checkpoint.keep",
                           "gpu.usd_per_gpu_hour"})
    EXPECT_NE(std::find(seen.begin(), seen.end(), path), seen.end()) << path << " is not in the schema";
}

// docs/interface.md: draft recipes need only schema_version, model, status, workload and layout
// (and train to run); measured and verified ones need the rest.
TEST(SchemaDocs, RequiredByStatusIsTheContracts) {
  const SchemaField& schema = recipe_schema();
  auto required = [&](const std::string& status, bool run) {
    SchemaContext context;
    context.status = status;
    context.run = run;
    std::vector<std::string> names;
    for (const SchemaField& field : schema.fields)
      if (schema_required(field, context)) names.push_back(field.name);
    return names;
  };
  const std::vector<std::string> draft = {"schema_version", "model", "status", "workload", "layout"};
  EXPECT_EQ(required("draft", false), draft);
  std::vector<std::string> draft_run = required("draft", true);
  EXPECT_EQ(draft_run.size(), draft.size() + 1);
  EXPECT_EQ(draft_run.back(), "train");
  for (const char* status : {"measured", "verified"}) {
    std::vector<std::string> all;
    for (const SchemaField& field : schema.fields)
      if (field.name != "train") all.push_back(field.name);
    EXPECT_EQ(required(status, false), all) << status;
  }
}

}  // namespace
}  // namespace loom
