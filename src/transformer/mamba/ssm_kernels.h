// The Mamba-2 mixer's kernels between its two projections, forward and backward, on plain
// row-major arrays (float for the model, double for the tests' finite differences):
//
//   causal convolution: out[t, c] = silu(bias[c] + sum_k w[c, k] in[t + k - (K - 1), c]), the
//     positions before the first read from `history` (generation) or as zeros;
//   state-space scan (Mamba-2's SSD, as its recurrence): per sequence and head h, with
//     dt = softplus(dt_raw + dt_bias[h]) (PyTorch's threshold 20), A = -exp(A_log[h]) and the
//     head's group g = h / (heads / groups),
//       S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T     (S: head_dim x state)
//       y_t = S_t C_t + D[h] x_t
//     from S_{-1} = 0 (or a carried state);
//   gated RMS norm (mamba_ssm's RMSNormGated, norm_before_gate=False): per group of channels,
//     out = g / sqrt(mean(g^2) + eps) * w with g = y * silu(z).
//
// Packed documents (Megatron's seq_idx with --dataloader-inter-document-masking): with doc_start
// set, each document is its own sequence: the convolution reads zeros before the document's first
// position and the scan restarts from S = 0 there (a document start has decay exp(dt A) := 0).
//
// Rows are tokens in [s, b] order (row t * b + i). The scan keeps the state at the start of every
// `chunk` positions for backward, which recomputes the states inside each chunk from it (memory:
// one state per chunk instead of per position).
#pragma once

#include <cstdint>

namespace megatron::ssm {

struct ConvShape {
  int64_t s = 0, b = 0, channels = 0, width = 0;  // width: the kernel's K
  // [b, s]: the first position of each token's document, or null (one document per sequence).
  // Not with history (generation has no packed documents).
  const int32_t* doc_start = nullptr;
};

// in, out: [s, b, channels]; w: [channels, width]; bias: [channels]; history: [b, width - 1,
// channels] (oldest first) or null.
template <typename T>
void conv_silu_forward(const ConvShape& sh, const T* in, const T* history, const T* w,
                       const T* bias, T* out);
// din written; dw, dbias accumulated (+=). Without history (training).
template <typename T>
void conv_silu_backward(const ConvShape& sh, const T* in, const T* w, const T* bias, const T* dout,
                        T* din, T* dw, T* dbias);
// The last width - 1 inputs of each sequence (history for the next call), [b, width - 1,
// channels], from this call's input and the previous history (null: zeros).
template <typename T>
void conv_history(const ConvShape& sh, const T* in, const T* history, T* next);

struct ScanShape {
  int64_t s = 0, b = 0, heads = 0, head_dim = 0, groups = 0, state = 0;
  int64_t chunk = 64;                  // positions between kept states
  const int32_t* doc_start = nullptr;  // [b, s], as ConvShape's (the state restarts at each)
  int64_t chunks() const { return (s + chunk - 1) / chunk; }
  // Elements of the kept states: [chunks, b, heads, state, head_dim].
  int64_t kept_states() const { return chunks() * b * heads * head_dim * state; }
};

// x: [s, b, heads, head_dim]; dt_raw: [s, b, heads]; B, C: [s, b, groups, state]; A_log, D,
// dt_bias: [heads]; y: [s, b, heads, head_dim]. state: [b, heads, head_dim, state], the carried
// state read and replaced by the final one (null: start from zero). kept: kept_states() elements
// for backward (null: none kept).
template <typename T>
void scan_forward(const ScanShape& sh, const T* x, const T* dt_raw, const T* A_log, const T* B,
                  const T* C, const T* D, const T* dt_bias, T* y, T* state, T* kept);
// dx, ddt_raw, dB, dC written; dA_log, dD, ddt_bias accumulated (+=). From a zero start state.
template <typename T>
void scan_backward(const ScanShape& sh, const T* x, const T* dt_raw, const T* A_log, const T* B,
                   const T* C, const T* D, const T* dt_bias, const T* kept, const T* dy, T* dx,
                   T* ddt_raw, T* dB, T* dC, T* dA_log, T* dD, T* ddt_bias);

// y, z, out: [rows, dim]; w: [dim]; groups of dim / groups consecutive channels; rstd: [rows,
// groups] (kept for backward).
template <typename T>
void gated_norm_forward(int64_t rows, int64_t dim, int64_t groups, double eps, const T* y,
                        const T* z, const T* w, T* out, T* rstd);
// dy, dz written; dw accumulated (+=).
template <typename T>
void gated_norm_backward(int64_t rows, int64_t dim, int64_t groups, const T* y, const T* z,
                         const T* w, const T* rstd, const T* dout, T* dy, T* dz, T* dw);

}  // namespace megatron::ssm
