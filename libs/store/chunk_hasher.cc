#include "libs/store/chunk_hasher.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

// EVP digest calls fail only when OpenSSL cannot allocate its context or finds no SHA-256
// implementation: a broken process, not bad input.
[[noreturn]] void DieOnOpenSslFailure(const char* what) {
  std::fprintf(stderr, "ckpt: OpenSSL %s failed for SHA-256\n", what);
  std::abort();
}

}  // namespace

struct Sha256Hasher::Context {
  EVP_MD_CTX* ctx = nullptr;
  Context() : ctx(EVP_MD_CTX_new()) {
    if (ctx == nullptr) DieOnOpenSslFailure("EVP_MD_CTX_new");
    Reset();
  }
  ~Context() { EVP_MD_CTX_free(ctx); }
  void Reset() {
    if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1)
      DieOnOpenSslFailure("EVP_DigestInit_ex");
  }
};

Sha256Hasher::Sha256Hasher() : context_(std::make_unique<Context>()) {}
Sha256Hasher::~Sha256Hasher() = default;
Sha256Hasher::Sha256Hasher(Sha256Hasher&&) noexcept = default;
Sha256Hasher& Sha256Hasher::operator=(Sha256Hasher&&) noexcept = default;

void Sha256Hasher::Update(absl::string_view bytes) {
  if (bytes.empty()) return;
  if (EVP_DigestUpdate(context_->ctx, bytes.data(), bytes.size()) != 1) {
    DieOnOpenSslFailure("EVP_DigestUpdate");
  }
}

std::string Sha256Hasher::Finish() {
  std::string digest(kSha256Bytes, '\0');
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(context_->ctx, reinterpret_cast<unsigned char*>(digest.data()), &length) !=
          1 ||
      length != kSha256Bytes) {
    DieOnOpenSslFailure("EVP_DigestFinal_ex");
  }
  context_->Reset();
  return digest;
}

std::string Sha256(absl::string_view bytes) {
  std::string digest(kSha256Bytes, '\0');
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(digest.data()),
                 &length, EVP_sha256(), nullptr) != 1 ||
      length != kSha256Bytes) {
    DieOnOpenSslFailure("EVP_Digest");
  }
  return digest;
}

void ContentHasher::AddChunk(const ChunkDigest& chunk) {
  char length[8];
  uint64_t value = static_cast<uint64_t>(chunk.length);
  for (char& byte : length) {
    byte = static_cast<char>(value & 0xff);
    value >>= 8;
  }
  hasher_.Update(chunk.sha256);
  hasher_.Update(absl::string_view(length, sizeof(length)));
}

std::string ContentHasher::Finish() { return hasher_.Finish(); }

std::string ContentHashOfBytes(absl::string_view bytes) {
  ContentHasher hasher;
  for (size_t offset = 0; offset < bytes.size(); offset += kChunkBytes) {
    hasher.AddChunk(HashChunk(bytes.substr(offset, kChunkBytes)));
  }
  return hasher.Finish();
}

ChunkDigest HashChunk(absl::string_view bytes) {
  ChunkDigest digest;
  digest.sha256 = Sha256(bytes);
  digest.xxh3_64 = Xxh3(bytes);
  digest.length = static_cast<int64_t>(bytes.size());
  return digest;
}

std::string HexEncode(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

absl::StatusOr<std::string> HexDecode(absl::string_view hex) {
  if (hex.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hex string has odd length ", hex.size(), ": '", hex, "'"));
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int high = digit(hex[2 * i]);
    const int low = digit(hex[2 * i + 1]);
    if (high < 0 || low < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "not a hex digit at position ", high < 0 ? 2 * i : 2 * i + 1, " of '", hex, "'"));
    }
    bytes[i] = static_cast<char>((high << 4) | low);
  }
  return bytes;
}

std::string ShortHex(absl::string_view sha256) { return HexEncode(sha256.substr(0, 6)); }

}  // namespace ckpt
