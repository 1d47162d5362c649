#include "data/sha256.h"

#include <openssl/evp.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace loom {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  if (state_->ctx == nullptr || EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1)
    throw_runtime_failure("sha256", "OpenSSL could not start a SHA-256 digest");
}

Sha256::~Sha256() {
  if (state_ && state_->ctx) EVP_MD_CTX_free(state_->ctx);
}

Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(state_->ctx, data, size) != 1)
    throw_runtime_failure("sha256", "digest update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(state_->ctx, digest, &length) != 1)
    throw_runtime_failure("sha256", "digest final failed");
  std::string hex;
  char buf[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", digest[i]);
    hex += buf;
  }
  return hex;
}

std::string sha256_file(const std::string& path, const std::atomic<bool>* stop) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_runtime_failure(path, "cannot open the file to hash it");
  Sha256 sha;
  std::vector<char> buf(1 << 20);
  while (in) {
    if (stop && stop->load(std::memory_order_relaxed)) return "";
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    sha.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) throw_runtime_failure(path, "read failed while hashing");
  return sha.hex_digest();
}

}  // namespace loom
