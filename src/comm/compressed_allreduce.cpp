// 1-bit compressed all-reduce (comm/compressed_allreduce.h).
#include "comm/compressed_allreduce.h"

#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace megatron {
namespace {

// ||v||_2 / sqrt(count), the sum of squares in double (torch's f32 norm sums in another order;
// the result differs in the last bits only).
float rms_scale(const float* v, int64_t count) {
  double s = 0;
  for (int64_t i = 0; i < count; ++i) s += static_cast<double>(v[i]) * v[i];
  return static_cast<float>(std::sqrt(s) / std::sqrt(static_cast<double>(count)));
}

// DeepSpeed's sign bit: (sign(x) + 1).bool(), true for x >= 0, -0 and NaN.
bool positive(float x) {
  return !(x < 0.0f);
}

int64_t words_for(int64_t bits) {
  return (bits + 31) / 32;
}

// Bits [begin, begin + count) of `signs` packed into words (bit k of word w: element 32 w + k).
void pack(const std::vector<uint8_t>& signs, int64_t begin, int64_t count, int32_t* words) {
  for (int64_t w = 0; w < words_for(count); ++w) {
    uint32_t v = 0;
    for (int64_t k = 0; k < 32 && 32 * w + k < count; ++k)
      if (signs[static_cast<size_t>(begin + 32 * w + k)]) v |= 1u << k;
    words[w] = static_cast<int32_t>(v);
  }
}

float unpacked(const int32_t* words, int64_t i) {
  return (static_cast<uint32_t>(words[i / 32]) >> (i % 32)) & 1u ? 1.0f : -1.0f;
}

}  // namespace

int64_t compressed_padded_size(int64_t n, int world) {
  const int64_t w = world;
  const int64_t divider = w * 8 / std::gcd(w, int64_t{8});  // lcm(W, 8)
  const int64_t unit = w * divider;
  return n % unit == 0 ? n : n + unit - n % unit;
}

CompressionErrors CompressionErrors::zeros(int64_t n, int world) {
  const int64_t padded = compressed_padded_size(n, world);
  return {Tensor::zeros({padded}, DType::kF32), Tensor::zeros({padded / world}, DType::kF32)};
}

void compressed_allreduce(float* m, int64_t n, CompressionErrors& errors, ProcessGroup& group) {
  const int W = group.size();
  if (W == 1 || n == 0) return;
  const int64_t padded = compressed_padded_size(n, W), c = padded / W;
  MEGATRON_ASSERT(errors.worker.numel() == padded && errors.server.numel() == c,
                  "compression errors of ", errors.worker.numel(), " / ", errors.server.numel(),
                  " elements for a tensor of ", n, " padded to ", padded);
  float* we = errors.worker.data<float>();
  float* se = errors.server.data<float>();

  // Worker: compensate, scale, keep the error, pack the signs of each server's chunk.
  std::vector<float> x(static_cast<size_t>(padded), 0.0f);
  for (int64_t i = 0; i < padded; ++i) x[i] = (i < n ? m[i] : 0.0f) + we[i];
  const float worker_scale = rms_scale(x.data(), padded);
  std::vector<uint8_t> signs(static_cast<size_t>(padded));
  for (int64_t i = 0; i < padded; ++i) {
    signs[i] = positive(x[i]);
    we[i] = x[i] - worker_scale * (signs[i] ? 1.0f : -1.0f);
  }
  const int64_t words = words_for(c);
  Tensor send = Tensor::empty({W * words}, DType::kI32);
  for (int j = 0; j < W; ++j) pack(signs, j * c, c, send.data<int32_t>() + j * words);
  Tensor recv = Tensor::empty({W * words}, DType::kI32);
  group.all_to_all(recv, send);
  Tensor my_scale = Tensor::full({1}, worker_scale, DType::kF32);
  Tensor scales = Tensor::empty({W}, DType::kF32);
  group.all_gather(scales, my_scale);

  // Server: the average of the workers' 1-bit chunks, compensated, compressed again.
  std::vector<float> y(static_cast<size_t>(c), 0.0f);
  for (int i = 0; i < W; ++i) {
    const float s = scales.data<float>()[i] * (1.0f / static_cast<float>(W));
    const int32_t* bits = recv.data<int32_t>() + i * words;
    for (int64_t k = 0; k < c; ++k) y[k] += unpacked(bits, k) * s;
  }
  for (int64_t k = 0; k < c; ++k) y[k] += se[k];
  const float server_scale = rms_scale(y.data(), c);
  std::vector<uint8_t> server_signs(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) {
    server_signs[k] = positive(y[k]);
    se[k] = y[k] - server_scale * (server_signs[k] ? 1.0f : -1.0f);
  }
  Tensor mine = Tensor::empty({words}, DType::kI32);
  pack(server_signs, 0, c, mine.data<int32_t>());
  Tensor all_signs = Tensor::empty({W * words}, DType::kI32);
  group.all_gather(all_signs, mine);
  Tensor my_server_scale = Tensor::full({1}, server_scale, DType::kF32);
  Tensor server_scales = Tensor::empty({W}, DType::kF32);
  group.all_gather(server_scales, my_server_scale);

  // Every rank assembles the same result.
  for (int j = 0; j < W; ++j) {
    const int32_t* bits = all_signs.data<int32_t>() + j * words;
    const float s = server_scales.data<float>()[j];
    for (int64_t k = 0; k < c && j * c + k < n; ++k) m[j * c + k] = unpacked(bits, k) * s;
  }
}

}  // namespace megatron
