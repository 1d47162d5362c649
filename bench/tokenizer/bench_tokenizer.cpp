// Encoding speed of loom's tokenizer on one thread: the C++ half of bench/tokenizer/run.py.
//
//   bench_tokenizer TOKENIZER DOCS.jsonl REPEATS
//
// DOCS.jsonl holds {"text": ...} per line. Each repeat encodes every document in order on
// this thread; the first repeat also warms the split cache, as a long run would. Prints one
// JSON object: bytes, tokens, the best and the first (cold cache) repeat's seconds and the
// FNV-1a hash of all ids
// (run.py checks it against the same hash of HF's ids).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER DOCS.jsonl REPEATS\n");
    return 2;
  }
  const loom::Tokenizer tokenizer = loom::Tokenizer::load(argv[1]);
  std::ifstream in(argv[2]);
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    bytes += docs.back().size();
  }
  const int repeats = std::stoi(argv[3]);
  double best = 1e30, first = 0;
  uint64_t hash = 0;
  size_t tokens = 0;
  std::vector<int32_t> ids;
  for (int r = 0; r < repeats; ++r) {
    hash = 1469598103934665603ull;
    tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& doc : docs) {
      ids.clear();
      tokenizer.encode_append(doc, &ids);
      tokens += ids.size();
      for (int32_t id : ids) hash = (hash ^ static_cast<uint32_t>(id)) * 1099511628211ull;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds < best) best = seconds;
    if (r == 0) first = seconds;
  }
  std::printf("%s\n", nlohmann::json{{"bytes", bytes},
                                     {"tokens", tokens},
                                     {"seconds", best},
                                     {"first_seconds", first},
                                     {"ids_fnv1a", std::to_string(hash)}}
                          .dump()
                          .c_str());
  return 0;
}
