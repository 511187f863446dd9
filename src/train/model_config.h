// From Arguments to a TransformerConfig: Megatron's flag semantics (defaults, padded vocabulary,
// --group-query-attention) in one place. Errors name the flag.
#pragma once

#include "train/arguments.h"
#include "transformer/config.h"

namespace megatron {

TransformerConfig transformer_config_from_args(const Arguments& args);
// A hybrid model's unified layer pattern (transformer/mamba/hybrid_pattern.h) from the flags:
// --hybrid-layer-pattern or its deprecated spelling --hybrid-override-pattern, with a legacy
// --mtp-hybrid-override-pattern appended once per --mtp-num-layers depth; empty: none given.
std::string hybrid_pattern_text(const Arguments& args);
// The flag that pattern came from, for messages: --hybrid-layer-pattern unless only the deprecated
// --hybrid-override-pattern is given.
std::string hybrid_pattern_flag(const Arguments& args);
// The --moe-* flags (dense when --num-experts is 0); validated by TransformerConfig::finalize.
MoeConfig moe_config_from_args(const Arguments& args);
// The vision-language flags of --model llava (the encoder's layers and the text length as
// resolve_encoder_decoder leaves them); empty (no encoder) for other models.
VisionConfig vision_config_from_args(const Arguments& args);
// The --fp8-* flags (off without --fp8-format; the flag rules are the CLI's validate_fp8_args).
Fp8Config fp8_config_from_args(const Arguments& args);

}  // namespace megatron
