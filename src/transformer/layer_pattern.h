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

// --no-rope-freq: an integer N (layers N, 2N, ... skip RoPE: [0]*(N-1)+[1] repeated, N dividing
// the layer count; 0: none, as Megatron's falsy value) or a list expression of one entry per
// layer; 1 marks a layer without RoPE.
std::vector<int> parse_no_rope_freq(const std::string& text, int64_t num_layers);

}  // namespace megatron
