// HybridPattern: Megatron Core's unified hybrid layer pattern (--hybrid-layer-pattern, core 0.17;
// --hybrid-override-pattern is its deprecated spelling and takes the same strings).
//
//   "<main>/<mtp>/<mtp>/..."      e.g. "M-M-|M-M*-/*E/*E"
//
// <main> is one symbol per decoder layer (M Mamba-2, * attention, - MLP, E Mixture of Experts),
// optionally cut by '|' into pipeline segments: segment g is virtual pipeline stage g (Megatron's
// flexible virtual pipeline parallelism; segments / --pipeline-model-parallel-size chunks per
// rank). Each "/<mtp>" after it is one multi-token prediction depth whose layers are <mtp> (every
// depth the same pattern, no '|'): Nemotron 3's MTP layers. Megatron's other symbols (G gated
// DeltaNet, D DeepSeek sparse attention, + MLA) are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron {

struct HybridPattern {
  std::string main;               // the decoder's layer symbols, '|' removed
  std::vector<int64_t> segments;  // layers per '|' segment, in order (one entry: no '|')
  std::string mtp;                // one MTP depth's layer symbols; empty: no MTP
  int64_t mtp_depths = 0;         // "/<mtp>" parts

  bool has_pipes() const { return segments.size() > 1; }
};

// Parses `text` (Megatron's parse_hybrid_pattern and its symbol checks); InvalidArgument naming
// `flag` for an unknown or unimplemented symbol, MTP parts that differ, or '|' in an MTP part.
HybridPattern parse_hybrid_pattern(const std::string& text, const std::string& flag);

// Megatron's legacy --mtp-hybrid-override-pattern P with --mtp-num-layers D: `pattern` with
// "/P" appended D times when it has no '/' yet (its conversion to the unified form); else
// `pattern` unchanged.
std::string with_legacy_mtp_pattern(const std::string& pattern, const std::string& mtp_pattern,
                                    int64_t mtp_num_layers);

}  // namespace megatron
