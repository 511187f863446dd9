// Per-tensor checksums of checkpoint payloads: XXH3-64 (xxHash), fast enough to verify every
// tensor on every load by default (tens of GB/s, well above the reader's throughput), written at
// save into metadata.json next to each shard. A flipped payload bit then stops the load with the
// file and tensor named instead of training on a corrupt weight. SHA-256 of whole files
// (--verify-integrity) remains the stronger, slower check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megatron::checkpoint {

// XXH3-64 of the bytes (seed 0), and as 16 lowercase hex digits.
uint64_t xxh3_64(const void* data, size_t bytes);
std::string xxh3_hex(const void* data, size_t bytes);

// What a load checks: nothing beyond sizes (--no-verify-integrity), each tensor's XXH3-64 (the
// default), or also each file's SHA-256 (--verify-integrity).
enum class Integrity { kSizesOnly, kTensors, kTensorsAndFiles };

}  // namespace megatron::checkpoint
