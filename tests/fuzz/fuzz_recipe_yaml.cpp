// A recipe file through recipe_validate (`loom recipe validate`: every defect a violation,
// never an exception) and recipe_load as `loom plan` loads it (RecipeUse::inspect); a recipe
// it accepts is written back as YAML, as result.yaml is. The seeds' init configs
// (recipes/tiny's config.json, moe-config.json, llama-config.json) lie beside the recipe.
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "fuzz_input.h"
#include "recipe/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir scratch;
  static const bool configs_copied = [] {
    for (const char* name : {"config.json", "moe-config.json", "llama-config.json"})
      std::filesystem::copy_file(std::filesystem::path(LOOM_SOURCE_DIR) / "recipes/tiny" / name,
                                 scratch.root() / name, std::filesystem::copy_options::overwrite_existing);
    return true;
  }();
  (void)configs_copied;
  const std::string path =
      scratch.write("recipe.yaml", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::expect_parsed_or_input_error([&] {
    loom::recipe_validate(path);
    const loom::Recipe recipe = loom::recipe_load(path, {}, loom::RecipeUse::inspect);
    loom::recipe_document_to_yaml(recipe.document);
  });
  return 0;
}
