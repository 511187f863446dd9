// Embedding lookups (whole or a vocabulary block) and their deterministic backward, rotary
// position embedding, and the passes of the vocabulary-parallel cross entropy.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>
#include <cstdint>

#include "tensor/cuda/common.cuh"

namespace megatron::cuda {
namespace {

__device__ inline int64_t id_at(const void* ids, bool i32, int64_t r) {
  return i32 ? static_cast<const int32_t*>(ids)[r] : static_cast<const int64_t*>(ids)[r];
}

__device__ inline double table_at(const void* t, int dtype, int64_t i) {
  switch (dtype) {
    case 0:
      return static_cast<const float*>(t)[i];
    case 1:
      return static_cast<const double*>(t)[i];
    case 2:
      return bf16_bits_to_f32(static_cast<const uint16_t*>(t)[i]);
    default:
      return f16_bits_to_f32(static_cast<const uint16_t*>(t)[i]);
  }
}

template <typename T>
__global__ void embedding_forward_kernel(T* out, const void* ids, bool i32, int64_t n,
                                         const void* table, int dtype, int64_t start, int64_t block,
                                         int64_t h) {
  MEGATRON_GRID_LOOP(i, n * h) {
    const int64_t r = i / h, c = i % h, local = id_at(ids, i32, r) - start;
    out[i] =
        local >= 0 && local < block ? static_cast<T>(table_at(table, dtype, local * h + c)) : T(0);
  }
}

template <typename E>
__global__ void embedding_rows_kernel(E* out, const void* ids, bool i32, int64_t n, const E* table,
                                      int64_t rows, int64_t h) {
  MEGATRON_GRID_LOOP(i, n * h) {
    const int64_t r = i / h, c = i % h, id = id_at(ids, i32, r);
    out[i] = id >= 0 && id < rows ? table[id * h + c] : E(0);
  }
}

// The backward in two steps: the tokens' local ids are sorted (a stable radix sort: equal ids keep
// token order), then a thread per (run of one id, column) adds that id's rows in token order onto
// its table row, as the other devices do; one writer per element, no atomics.
__global__ void embedding_keys_kernel(int32_t* keys, int32_t* order, const void* ids, bool i32,
                                      int64_t n, int64_t start, int64_t block) {
  MEGATRON_GRID_LOOP(r, n) {
    const int64_t local = id_at(ids, i32, r) - start;
    keys[r] = local >= 0 && local < block ? static_cast<int32_t>(local)
                                          : static_cast<int32_t>(block);  // sorts last, skipped
    order[r] = static_cast<int32_t>(r);
  }
}

template <typename T>
__global__ void embedding_runs_kernel(T* dtable, const T* dout, const int32_t* keys,
                                      const int32_t* order, int64_t n, int64_t block, int64_t h) {
  MEGATRON_GRID_LOOP(i, n * h) {
    const int64_t p = i / h, c = i % h;
    const int32_t key = keys[p];
    if (key == block || (p > 0 && keys[p - 1] == key)) continue;  // not the start of a run
    T acc = dtable[key * h + c];
    for (int64_t q = p; q < n && keys[q] == key; ++q) acc += dout[order[q] * h + c];
    dtable[key * h + c] = acc;
  }
}

// inv_freq of pair j with Llama 3.1's scaling (reference.cpp's rope_inv_freq).
__device__ inline double rope_inv_freq(const RopeArgs& a, int64_t j) {
  const double base_freq = 1.0 / pow(a.base, static_cast<double>(2 * j) / a.rot_dim);
  if (a.yarn_factor > 0) {  // YaRN's ramp (ops::rope_inv_freqs)
    const double r =
        fmin(fmax((static_cast<double>(j) - a.yarn_low) / (a.yarn_high - a.yarn_low), 0.0), 1.0);
    return base_freq / a.yarn_factor * r + base_freq * (1 - r);
  }
  if (a.scaling_factor <= 0) return base_freq;
  const double wavelen = 2 * M_PI / base_freq;
  if (wavelen < 2048.0) return base_freq;
  if (wavelen > 8192.0) return base_freq / a.scaling_factor;
  const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
  return (1 - smooth) * base_freq / a.scaling_factor + smooth * base_freq;
}

template <typename T>
__global__ void rope_kernel(T* x, RopeArgs a) {
  const int64_t half = a.rot_dim / 2, heads = a.head_end - a.head_begin;
  MEGATRON_GRID_LOOP(i, a.s * a.b * a.groups * heads * half) {
    const int64_t j = i % half;
    int64_t rest = i / half;
    const int64_t p = a.head_begin + rest % heads;
    rest /= heads;
    const int64_t g = rest % a.groups;
    rest /= a.groups;
    const int64_t bb = rest % a.b, t = rest / a.b;
    double pos =
        a.positions ? static_cast<double>(a.positions[t * a.b + bb]) : static_cast<double>(t);
    pos *= a.position_scale;
    double theta = pos * rope_inv_freq(a, j);
    if (a.inverse) theta = -theta;
    T* v = x + (((t * a.b + bb) * a.groups + g) * a.per_group + p) * a.hn;
    const int64_t i1 = a.interleaved ? 2 * j : j, i2 = a.interleaved ? 2 * j + 1 : j + half;
    const T c = static_cast<T>(a.mscale * cos(theta)), s = static_cast<T>(a.mscale * sin(theta));
    const T x1 = v[i1], x2 = v[i2];
    v[i1] = x1 * c - x2 * s;
    v[i2] = x2 * c + x1 * s;
  }
}

template <typename T>
__global__ void ce_row_max_kernel(T* row_max, const T* logits, int64_t cols, int64_t valid) {
  __shared__ T shared[32];
  const T* row = logits + blockIdx.x * cols;
  T m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = max(m, row[j]);
  m = block_max(m, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <typename T>
__global__ void ce_sums_kernel(double* sums, const T* logits, const T* row_max,
                               const int64_t* targets, int64_t n, int64_t cols, int64_t vocab_start,
                               int64_t valid) {
  __shared__ double shared[32];
  const int64_t r = blockIdx.x;
  const T* row = logits + r * cols;
  const T m = row_max[r];
  double z = 0;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x)
    z += static_cast<double>(exp(row[j] - m));
  z = block_sum(z, shared);
  if (threadIdx.x == 0) {
    const int64_t local = targets[r] - vocab_start;
    sums[r] = z;
    sums[n + r] = local >= 0 && local < valid ? static_cast<double>(row[local]) : 0.0;
  }
}

template <typename T>
__global__ void ce_finish_kernel(T* loss, T* lse, const T* row_max, const double* sums, int64_t n) {
  MEGATRON_GRID_LOOP(r, n) {
    const double l = static_cast<double>(row_max[r]) + log(sums[r]);
    lse[r] = static_cast<T>(l);
    loss[r] = static_cast<T>(l - sums[n + r]);
  }
}

template <typename T>
__global__ void ce_backward_kernel(T* dlogits, const T* dloss, const T* logits, const T* lse,
                                   const int64_t* targets, int64_t n, int64_t cols,
                                   int64_t vocab_start, int64_t valid) {
  MEGATRON_GRID_LOOP(i, n * cols) {
    const int64_t r = i / cols, j = i % cols;
    const T x = logits[i];
    dlogits[i] = j < valid
                     ? dloss[r] * (exp(x - lse[r]) - (vocab_start + j == targets[r] ? T(1) : T(0)))
                     : T(0);
  }
}

}  // namespace

void embedding_rows(void* out, const void* ids, bool ids_i32, int64_t n, const void* table,
                    size_t elem, int64_t rows, int64_t h) {
  if (n * h == 0) return;
  const unsigned blocks = blocks_for(n * h);
  switch (elem) {
    case 2:
      embedding_rows_kernel<<<blocks, kThreads>>>(static_cast<uint16_t*>(out), ids, ids_i32, n,
                                                  static_cast<const uint16_t*>(table), rows, h);
      break;
    case 4:
      embedding_rows_kernel<<<blocks, kThreads>>>(static_cast<uint32_t*>(out), ids, ids_i32, n,
                                                  static_cast<const uint32_t*>(table), rows, h);
      break;
    case 8:
      embedding_rows_kernel<<<blocks, kThreads>>>(static_cast<uint64_t*>(out), ids, ids_i32, n,
                                                  static_cast<const uint64_t*>(table), rows, h);
      break;
    default:
      cuda_fail("embedding_forward", "table elements must be 2, 4 or 8 bytes");
  }
  check_launch("embedding_forward");
}

template <typename T>
void embedding_forward(T* out, const void* ids, bool ids_i32, int64_t n, const void* table,
                       int table_dtype, int64_t start, int64_t block, int64_t h) {
  if (n * h == 0) return;
  embedding_forward_kernel<<<blocks_for(n * h), kThreads>>>(out, ids, ids_i32, n, table,
                                                            table_dtype, start, block, h);
  check_launch("embedding_forward");
}

template <typename T>
void embedding_backward(T* dtable, const T* dout, const void* ids, bool ids_i32, int64_t n,
                        int64_t start, int64_t block, int64_t h) {
  if (n * h == 0) return;
  if (n > INT32_MAX || block >= INT32_MAX) {
    cuda_fail("embedding_backward", "more than 2^31 tokens or table rows");
  }
  // Workspace slot 1: keys and order, sorted keys and order, the sort's temporary storage.
  int end_bit = 1;
  while ((int64_t{1} << end_bit) <= block) ++end_bit;
  size_t sort_bytes = 0;
  cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit);
  const size_t ints = 4 * static_cast<size_t>(n);
  auto* keys = static_cast<int32_t*>(workspace(sizeof(int32_t) * ints + sort_bytes + 256, 1));
  int32_t *order = keys + n, *sorted_keys = keys + 2 * n, *sorted_order = keys + 3 * n;
  void* temp =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(keys + ints) + 255) & ~uintptr_t{255});
  embedding_keys_kernel<<<blocks_for(n), kThreads>>>(keys, order, ids, ids_i32, n, start, block);
  check_launch("embedding_backward (keys)");
  if (cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, order, sorted_order, n,
                                      0, end_bit) != cudaSuccess) {
    cuda_fail("embedding_backward", "sorting the token ids failed");
  }
  embedding_runs_kernel<<<blocks_for(n * h), kThreads>>>(dtable, dout, sorted_keys, sorted_order, n,
                                                         block, h);
  check_launch("embedding_backward");
}

template <typename T>
void rope(T* x, const RopeArgs& a) {
  const int64_t n = a.s * a.b * a.groups * (a.head_end - a.head_begin) * (a.rot_dim / 2);
  if (n <= 0) return;
  rope_kernel<<<blocks_for(n), kThreads>>>(x, a);
  check_launch("rope_inplace");
}

template <typename T>
void ce_row_max(T* row_max, const T* logits, int64_t n, int64_t cols, int64_t valid) {
  if (n == 0) return;
  ce_row_max_kernel<<<static_cast<unsigned>(n), kThreads>>>(row_max, logits, cols, valid);
  check_launch("cross_entropy_shard_max");
}
template <typename T>
void ce_sums(double* sums, const T* logits, const T* row_max, const int64_t* targets, int64_t n,
             int64_t cols, int64_t vocab_start, int64_t valid) {
  if (n == 0) return;
  ce_sums_kernel<<<static_cast<unsigned>(n), kThreads>>>(sums, logits, row_max, targets, n, cols,
                                                         vocab_start, valid);
  check_launch("cross_entropy_shard_sums");
}
template <typename T>
void ce_finish(T* loss, T* lse, const T* row_max, const double* sums, int64_t n) {
  if (n == 0) return;
  ce_finish_kernel<<<blocks_for(n), kThreads>>>(loss, lse, row_max, sums, n);
  check_launch("cross_entropy_shard_finish");
}
template <typename T>
void ce_backward(T* dlogits, const T* dloss, const T* logits, const T* lse, const int64_t* targets,
                 int64_t n, int64_t cols, int64_t vocab_start, int64_t valid) {
  if (n * cols == 0) return;
  ce_backward_kernel<<<blocks_for(n * cols), kThreads>>>(dlogits, dloss, logits, lse, targets, n,
                                                         cols, vocab_start, valid);
  check_launch("cross_entropy_backward");
}

#define MEGATRON_INSTANTIATE(T)                                                                    \
  template void embedding_forward<T>(T*, const void*, bool, int64_t, const void*, int, int64_t,    \
                                     int64_t, int64_t);                                            \
  template void embedding_backward<T>(T*, const T*, const void*, bool, int64_t, int64_t, int64_t,  \
                                      int64_t);                                                    \
  template void rope<T>(T*, const RopeArgs&);                                                      \
  template void ce_row_max<T>(T*, const T*, int64_t, int64_t, int64_t);                            \
  template void ce_sums<T>(double*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, \
                           int64_t);                                                               \
  template void ce_finish<T>(T*, T*, const T*, const double*, int64_t);                            \
  template void ce_backward<T>(T*, const T*, const T*, const T*, const int64_t*, int64_t, int64_t, \
                               int64_t, int64_t);
MEGATRON_INSTANTIATE(float)
MEGATRON_INSTANTIATE(double)
#undef MEGATRON_INSTANTIATE

}  // namespace megatron::cuda
