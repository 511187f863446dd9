// Weight/optimizer estimate and resident-memory measurement (Linux: /proc/self/statm, getrusage).
#include "train/memory_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/logging.h"

namespace megatron {

double weight_and_optimizer_bytes_per_param(DType compute_dtype, int64_t moment_shards) {
  const double half_copy = is_half(compute_dtype) ? 2.0 : 0.0;
  return 4.0 /* fp32 main */ + half_copy + 4.0 /* fp32 grad */ +
         8.0 / static_cast<double>(moment_shards) /* Adam moments */;
}

std::string theoretical_memory_line(int64_t params, DType compute_dtype, int64_t moment_shards,
                                    int64_t activation_bytes) {
  const double mb = static_cast<double>(params) *
                    weight_and_optimizer_bytes_per_param(compute_dtype, moment_shards) / 1048576.0;
  const double act = static_cast<double>(activation_bytes) / 1048576.0;
  return strprintf(
      "Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, "
      "total=%.2f MB",
      mb, act, mb + act);
}

int64_t activation_bytes_per_microbatch(const TransformerConfig& c, const ActivationShape& a) {
  const int64_t s = c.seq_length, b = a.micro_batch_size, h = c.hidden_size, t = a.tp;
  const int64_t np = c.num_attention_heads, ng = c.num_query_groups, hn = c.head_dim();
  const int64_t f = c.ffn_hidden_size, sb = s * b;
  const int64_t s_local_b = a.sequence_parallel && t > 1 ? sb / t : sb;  // s' b
  const int64_t e = 4;                                                   // fp32 activations
  const int64_t g = is_half(c.compute_dtype) ? 2 : 4;                    // saved GEMM inputs
  const int64_t stats = (c.normalization == Normalization::kLayerNorm ? 2 : 1) * s_local_b * e;
  const int64_t core = (sb * np * hn + b * np * s) / t * e;  // attention out + lse
  const int64_t layer = 2 * s_local_b * h * e + 2 * stats    // input, x1, norm statistics
                        + 2 * sb * h * g                     // qkv and fc1 GEMM inputs
                        + sb * (np + 2 * ng) * hn / t * e    // qkv after RoPE
                        + core
                        // linear_proj's input: the attention output itself in fp32 runs, a
                        // 16-bit copy otherwise
                        + (g == 4 ? 0 : sb * np * hn / t * g) +
                        sb * (c.swiglu ? 2 * f : f) / t * e  // fc1 output
                        + sb * f / t * g;                    // fc2 input
  const int64_t input = s_local_b * h * e;                   // a recomputed segment's input
  const int64_t L = a.num_layers;
  int64_t bytes = 0;
  switch (c.recompute_granularity) {
    case RecomputeGranularity::kNone:
      bytes = L * layer;
      break;
    case RecomputeGranularity::kSelective:
      bytes = L * (layer - core);
      break;
    case RecomputeGranularity::kFull: {
      const int64_t n = std::max<int64_t>(c.recompute_num_layers, 1);
      bytes = c.recompute_method == RecomputeMethod::kUniform
                  ? (L + n - 1) / n * input
                  : std::min(n, L) * input + std::max<int64_t>(L - n, 0) * layer;
      break;
    }
  }
  if (a.post_process) {
    const int64_t vp_local = c.padded_vocab_size / t;
    // Final norm (input and statistics), output GEMM input, fp32 logits, their lse, targets.
    bytes += s_local_b * h * e + stats + sb * h * g + sb * vp_local * e + sb * e + sb * 8;
  }
  if (a.pre_process) bytes += 2 * sb * 8;  // token and position ids, i64
  return bytes;
}

double resident_mb() {
  long pages_total = 0, pages_resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  const int got = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  if (got != 2) return 0;
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         1048576.0;
}

double max_resident_mb() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  // Linux reports KiB. Its high-water mark is only updated at some points (unmaps, exits), so
  // it can trail the current resident set: the peak is at least what is resident now.
  return std::max(static_cast<double>(u.ru_maxrss) / 1024.0, resident_mb());
}

}  // namespace megatron
