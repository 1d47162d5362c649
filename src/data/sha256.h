// SHA-256 (OpenSSL's EVP): the checksums of row stores, tokenizer files and inputs.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

namespace loom {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(const void* data, size_t size);
  std::string hex_digest();  // 64 lowercase hex digits; ends the computation

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The sha256 of a file's bytes; RuntimeFailure naming the path if it cannot be read. With
// `stop`, the read gives up between 1 MiB pieces once *stop is true and returns "".
std::string sha256_file(const std::string& path, const std::atomic<bool>* stop = nullptr);

}  // namespace loom
