// Megatron's per-layer list expressions (--moe-layer-freq, --no-rope-freq): the Python list
// expression its argument parser evaluates, restricted to what those flags take, terms of 0/1
// lists joined by '+', each "[a, b, ...]" optionally "*count", optionally in parentheses, e.g.
// "([0]*3+[1]*1)*3".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

// The expression's entries, each 0 or 1; errors name `flag` and say what an entry means
// (`entries`, e.g. "0 (dense) or 1 (MoE)").
std::vector<int> parse_layer_pattern(const std::string& text, const std::string& flag,
                                     const std::string& entries);

// A flag that takes an integer N or a list expression (--moe-layer-freq, --no-rope-freq): the
// expression's entries, checked to be one per layer, or the integer (`every`, >= 0; the caller
// expands it). Errors name `flag`.
struct LayerFreq {
  std::vector<int> pattern;  // empty for an integer
  int64_t every = 0;
};
LayerFreq parse_layer_freq(const std::string& text, int64_t num_layers, const std::string& flag,
                           const std::string& entries);

// --no-rope-freq: an integer N (layers N, 2N, ... skip RoPE: [0]*(N-1)+[1] repeated, N dividing
// the layer count; 0: none, as Megatron's falsy value) or a list expression of one entry per
// layer; 1 marks a layer without RoPE.
std::vector<int> parse_no_rope_freq(const std::string& text, int64_t num_layers);

// --window-attn-skip-freq: an integer N (every N-th layer, the N-th, 2N-th, ..., has full
// attention, the others the sliding window: Megatron's layer_number % N != 0) or a list expression
// of one entry per layer, 1 for the window. Returns one entry per layer, 1 for the window.
std::vector<int> parse_window_attn_skip_freq(const std::string& text, int64_t num_layers);

}  // namespace megatron
