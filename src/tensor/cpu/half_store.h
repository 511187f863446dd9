// Stores of f32/f64 results into 16-bit outputs (and bf16 loads), written so that GCC vectorises
// the loops around them: the value is rounded as f32_to_bf16 / f32_to_f16 (and so convert()) round
// it, and stored through a uint16_t pointer (a loop storing the bf16/f16 structs themselves stays
// scalar: "complicated access pattern").
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "tensor/tensor.h"

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

// The value a stored element of type O holds, as T (bf16 read exactly; the loads GCC vectorises).
template <typename O, typename T>
inline T loaded_value(StoredAs<O> s) {
  if constexpr (std::is_same_v<O, bf16>) {
    return static_cast<T>(std::bit_cast<float>(static_cast<uint32_t>(s) << 16));
  } else {
    static_assert(!std::is_same_v<O, f16>, "f16 loads: use f16_to_f32");
    return static_cast<T>(s);
  }
}

// p as the pointer the stores go through.
template <typename O>
inline StoredAs<O>* stored_ptr(O* p) {
  return reinterpret_cast<StoredAs<O>*>(p);
}
template <typename O>
inline const StoredAs<O>* stored_ptr(const O* p) {
  return reinterpret_cast<const StoredAs<O>*>(p);
}

// The optimizer steps' one-pass rounding: calls run(store), where store(i, w) writes element i of
// the 16-bit compute copy `rounded` (bf16 or f16, rounded through f32 as convert() rounds) from
// the updated weight w, or does nothing without one.
template <typename T, typename Run>
void with_rounded_store(Tensor* rounded, Run&& run) {
  if (!rounded) {
    run([](int64_t, T) {});
  } else if (rounded->dtype() == DType::kBF16) {
    StoredAs<bf16>* r = stored_ptr(rounded->data<bf16>());
    run([r](int64_t i, T w) { r[i] = stored_value<bf16>(w); });
  } else {
    StoredAs<f16>* r = stored_ptr(rounded->data<f16>());
    run([r](int64_t i, T w) { r[i] = stored_value<f16>(w); });
  }
}

// Calls fn.template operator()<O>() with O = T, bf16 or f16 from out's dtype (16-bit outputs for
// f32 inputs only).
template <typename T, typename Fn>
void dispatch_out(const Tensor& out, const char* op, Fn&& fn) {
  if (out.dtype() == detail::dtype_of<T>()) {
    fn.template operator()<T>();
    return;
  }
  constexpr bool kF32 = std::is_same_v<T, float>;
  MEGATRON_CHECK(kF32 && is_half(out.dtype()), op, ": output ", out.str(),
                 " must have the input's dtype ", dtype_name(detail::dtype_of<T>()),
                 " (or bf16/f16 for f32 input)");
  if constexpr (kF32) {
    if (out.dtype() == DType::kBF16) {
      fn.template operator()<bf16>();
    } else {
      fn.template operator()<f16>();
    }
  }
}

}  // namespace megatron::cpu
