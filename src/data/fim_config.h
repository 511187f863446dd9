// FimConfig: the --fim-* flags of fill-in-the-middle data (data/fim_dataset.h), with Megatron's
// defaults.
#pragma once

#include <optional>
#include <string>

namespace megatron {

// The --fim-* flags (Megatron's defaults).
struct FimConfig {
  double rate = 0.5;                          // --fim-rate
  double spm_rate = 0.5;                      // --fim-spm-rate
  std::string split_sample;                   // --fim-split-sample: a token; "" = none
  std::optional<double> fragment_rate;        // --fim-fragment-rate (needed with split_sample)
  std::optional<std::string> no_prefix;       // --fim-no-prefix
  std::string prefix_token = "<fim_prefix>";  // --fim-prefix-token
  std::string middle_token = "<fim_middle>";  // --fim-middle-token
  std::string suffix_token = "<fim_suffix>";  // --fim-suffix-token
  std::string pad_token = "<fim_pad>";        // --fim-pad-token
  std::string eod_token = "<|endoftext|>";    // --fim-eod-token
};

// Refuses rates outside [0, 1] and --fim-split-sample without --fim-fragment-rate, naming the
// flag.
void validate_fim_config(const FimConfig& config);

}  // namespace megatron
