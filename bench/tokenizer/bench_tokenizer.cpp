// Encoding speed of loom's tokenizer on one thread: the C++ half of bench/tokenizer/run.py.
//
//   bench_tokenizer TOKENIZER DOCS.jsonl REPEATS
//
// DOCS.jsonl holds {"text": ...} per line. Each repeat loads a fresh Tokenizer (not timed)
// and encodes every document in order on this thread twice:
//   cold  the first pass, with an empty split cache (what one pass over new data costs);
//   warm  the second pass over the same documents, every split already cached.
// HF `tokenizers` keeps a BPE cache too (10,000 words); run.py times it the same two ways.
// Prints one JSON object: bytes, tokens, the best cold and warm seconds, and the FNV-1a
// hash of all ids (run.py checks it against the same hash of HF's ids).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/version.h"
#include "data/tokenizer.h"

namespace {

struct Pass {
  double seconds;
  size_t tokens;
  uint64_t hash;
};

Pass encode_all(const loom::Tokenizer& tokenizer, const std::vector<std::string>& docs) {
  Pass p{0, 0, 1469598103934665603ull};
  std::vector<int32_t> ids;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& doc : docs) {
    ids.clear();
    tokenizer.encode_append(doc, &ids);
    p.tokens += ids.size();
    for (int32_t id : ids) p.hash = (p.hash ^ static_cast<uint32_t>(id)) * 1099511628211ull;
  }
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: bench_tokenizer TOKENIZER DOCS.jsonl REPEATS\n");
    return 2;
  }
  std::ifstream in(argv[2]);
  std::vector<std::string> docs;
  size_t bytes = 0;
  for (std::string line; std::getline(in, line);) {
    docs.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    bytes += docs.back().size();
  }
  const int repeats = std::stoi(argv[3]);
  double cold = 1e30, warm = 1e30;
  Pass last{};
  for (int r = 0; r < repeats; ++r) {
    const loom::Tokenizer tokenizer = loom::Tokenizer::load(argv[1]);  // a new instance: an empty cache
    const Pass first = encode_all(tokenizer, docs);
    last = encode_all(tokenizer, docs);
    if (first.hash != last.hash) {
      std::fprintf(stderr, "bench_tokenizer: the warm pass gave other ids than the cold one\n");
      return 1;
    }
    cold = std::min(cold, first.seconds);
    warm = std::min(warm, last.seconds);
  }
  std::printf("%s\n", nlohmann::json{{"bytes", bytes},
                                     {"tokens", last.tokens},
                                     {"cold_seconds", cold},
                                     {"warm_seconds", warm},
                                     {"ids_fnv1a", std::to_string(last.hash)},
                                     {"loom", loom::loom_version()}}
                          .dump()
                          .c_str());
  return 0;
}
