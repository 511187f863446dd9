// Hybrid layer allocation (Megatron's algorithm) and the Mamba sizes' checks.
#include "transformer/mamba/mamba_config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace megatron {

namespace {

// Python's round(): halves to even (Megatron's counts are round(n * ratio)).
int64_t round_half_even(double v) {
  return static_cast<int64_t>(std::nearbyint(v));
}

// _allocate_auto: attention layers placed where the running Mamba section length drops below
// one half, then MLP layers among the Mamba layers the same way.
std::string allocate_auto(int64_t n, double attention_ratio, double mlp_ratio) {
  const int64_t attention = round_half_even(static_cast<double>(n) * attention_ratio);
  int64_t mamba = n - attention;
  const double section = static_cast<double>(mamba) / static_cast<double>(attention + 1);
  std::string out(static_cast<size_t>(n), 'M');
  double x = section;
  for (int64_t l = 0; l < n; ++l) {
    if (x < 0.5) {
      out[static_cast<size_t>(l)] = '*';
      x += section;
    } else {
      x -= 1;
    }
  }
  const int64_t mlp = round_half_even(static_cast<double>(n) * mlp_ratio);
  if (mlp > 0) {
    mamba -= mlp;
    const double ratio = static_cast<double>(mamba) / static_cast<double>(mlp);
    x = ratio;
    for (int64_t l = 0; l < n; ++l) {
      if (out[static_cast<size_t>(l)] != 'M') continue;
      if (x < 0.5) {
        out[static_cast<size_t>(l)] = '-';
        x += ratio;
      } else {
        x -= 1;
      }
    }
  }
  return out;
}

}  // namespace

std::string allocate_hybrid_layers(int64_t num_layers, double attention_ratio, double mlp_ratio,
                                   const std::string& override_pattern, const std::string& flag) {
  MEGATRON_CHECK(num_layers > 0, "--num-layers must be positive, got ", num_layers);
  MEGATRON_CHECK(attention_ratio >= 0 && attention_ratio <= 1,
                 "--hybrid-attention-ratio must be in [0, 1], got ", attention_ratio);
  MEGATRON_CHECK(mlp_ratio >= 0 && mlp_ratio <= 1, "--hybrid-mlp-ratio must be in [0, 1], got ",
                 mlp_ratio);
  MEGATRON_CHECK(attention_ratio + mlp_ratio <= 1.0, "--hybrid-attention-ratio (", attention_ratio,
                 ") + --hybrid-mlp-ratio (", mlp_ratio, ") must not exceed 1");
  std::string layers = allocate_auto(num_layers, attention_ratio, mlp_ratio);
  if (override_pattern.empty()) return layers;
  MEGATRON_CHECK(static_cast<int64_t>(override_pattern.size()) == num_layers, flag, " '",
                 override_pattern, "' is the wrong length: got ", override_pattern.size(),
                 ", expected ", num_layers, " (--num-layers)");
  for (char c : override_pattern)
    MEGATRON_CHECK(c == 'M' || c == '*' || c == '-' || c == 'E', flag, ": '", std::string(1, c),
                   "' is not a layer symbol; use M (Mamba), * (attention), - (MLP) or E (Mixture "
                   "of Experts)");
  if (attention_ratio > 0 || mlp_ratio > 0) {
    for (char c : {'M', '*', '-', 'E'})
      MEGATRON_CHECK(std::count(layers.begin(), layers.end(), c) ==
                         std::count(override_pattern.begin(), override_pattern.end(), c),
                     flag, " '", override_pattern,
                     "' must hold as many of "
                     "each layer type as the ratios' pattern '",
                     layers, "' (Megatron's rule): fix the pattern or drop the ratios");
  }
  return override_pattern;
}

void MambaConfig::validate(int64_t num_layers, int64_t hidden, int64_t tp) const {
  if (!enabled()) return;
  MEGATRON_CHECK(static_cast<int64_t>(layers.size()) == num_layers, "the hybrid pattern '", layers,
                 "' has ", layers.size(), " layers, --num-layers ", num_layers);
  for (char c : mtp_layers)
    MEGATRON_CHECK(c == 'M' || c == '*' || c == '-' || c == 'E', "the MTP layer pattern '",
                   mtp_layers, "': '", std::string(1, c), "' is not a layer symbol");
  MEGATRON_CHECK(state_dim > 0, "--mamba-state-dim must be positive, got ", state_dim);
  MEGATRON_CHECK(head_dim > 0, "--mamba-head-dim must be positive, got ", head_dim);
  MEGATRON_CHECK(num_groups > 0, "--mamba-num-groups must be positive, got ", num_groups);
  MEGATRON_CHECK(num_heads >= 0,
                 "--mamba-num-heads must be >= 0 (0: 2 x --hidden-size / "
                 "--mamba-head-dim), got ",
                 num_heads);
  if (!has_mamba()) return;
  if (num_heads == 0)
    MEGATRON_CHECK((expand * hidden) % head_dim == 0, "the Mamba inner size 2 x --hidden-size (",
                   expand * hidden, ") must be divisible by --mamba-head-dim (", head_dim,
                   "), or set --mamba-num-heads");
  const int64_t h = heads(hidden);
  MEGATRON_CHECK(h % tp == 0, "the Mamba heads (", h,
                 ") must be divisible by --tensor-model-parallel-size (", tp,
                 "): each rank needs whole heads");
  MEGATRON_CHECK(num_groups % tp == 0, "--mamba-num-groups (", num_groups,
                 ") must be divisible by --tensor-model-parallel-size (", tp,
                 "): each rank needs whole groups");
  MEGATRON_CHECK(h % num_groups == 0, "the Mamba heads (", h,
                 ") must be divisible by --mamba-num-groups (", num_groups, ")");
}

}  // namespace megatron
