// XXH3-64 through the system's xxHash library.
#include "checkpoint/checksum.h"

#include <xxhash.h>

#include <cstdint>

namespace megatron::checkpoint {

uint64_t xxh3_64(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

std::string xxh3_hex(const void* data, size_t bytes) {
  const uint64_t h = xxh3_64(data, bytes);
  static const char* hex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[static_cast<size_t>(15 - i)] = hex[(h >> (4 * i)) & 15];
  return out;
}

}  // namespace megatron::checkpoint
