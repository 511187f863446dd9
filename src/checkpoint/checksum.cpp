// XXH3-64 through the system's xxHash library.
#include "checkpoint/checksum.h"

#include <xxhash.h>

#include <cstdint>

namespace megatron::checkpoint {

std::string xxh3_hex(const void* data, size_t bytes) {
  const uint64_t h = XXH3_64bits(data, bytes);
  static const char* hex = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[static_cast<size_t>(15 - i)] = hex[(h >> (4 * i)) & 15];
  return out;
}

}  // namespace megatron::checkpoint
