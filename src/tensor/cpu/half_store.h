// Stores of f32/f64 results into 16-bit outputs, written so that GCC vectorises the loops around
// them: the value is rounded as f32_to_bf16 / f32_to_f16 (and so convert()) round it, and stored
// through a uint16_t pointer (a loop storing the bf16/f16 structs themselves stays scalar:
// "complicated access pattern").
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace megatron::cpu {

// What an output of type O is stored as: O itself, or the 16 bits of a bf16 / f16.
template <typename O>
using StoredAs = std::conditional_t<std::is_same_v<O, bf16> || std::is_same_v<O, f16>, uint16_t, O>;

template <typename O, typename T>
inline StoredAs<O> stored_value(T v) {
  if constexpr (std::is_same_v<O, bf16>) {
    return f32_to_bf16(static_cast<float>(v)).bits;
  } else if constexpr (std::is_same_v<O, f16>) {
    return f32_to_f16(static_cast<float>(v)).bits;
  } else {
    return v;
  }
}

// p as the pointer the stores go through.
template <typename O>
inline StoredAs<O>* stored_ptr(O* p) {
  return reinterpret_cast<StoredAs<O>*>(p);
}

}  // namespace megatron::cpu
