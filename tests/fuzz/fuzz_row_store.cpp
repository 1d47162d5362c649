// A row store folder (data/row_store.h) through RowStore::open: the input holds its
// manifest.json, tokens.bin, loss_mask.bin and samples.bin in that order (fuzz_input.h
// split_files; a section left out is a file left out), read with the seeds' vocabulary (Qwen3's, 151,936
// ids).
#include <cstdint>
#include <filesystem>

#include "data/row_store.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir scratch;
  static const char* const kFiles[] = {"manifest.json", "tokens.bin", "loss_mask.bin", "samples.bin"};
  const std::filesystem::path store = scratch.root() / "store";
  std::filesystem::remove_all(store);
  std::filesystem::create_directories(store);
  const std::vector<std::string_view> files = loom::fuzz::split_files(data, size);
  for (size_t i = 0; i < files.size() && i < std::size(kFiles); ++i)
    scratch.write(std::string("store/") + kFiles[i], files[i]);
  loom::fuzz::expect_parsed_or_input_error([&] {
    loom::RowStoreExpect expect;
    expect.vocab_size = 151936;
    loom::RowStore::open(store.string(), expect);
  });
  return 0;
}
