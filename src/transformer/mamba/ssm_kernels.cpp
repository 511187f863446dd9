// Mamba-2's convolution, scan and gated norm as loops over plain arrays (see ssm_kernels.h).
// Threads split sequences and heads (or channels), never a sum: every result is the same bits on
// any thread count.
#include "transformer/mamba/ssm_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace megatron::ssm {

namespace {

template <typename T>
T sigmoid(T v) {
  return T(1) / (T(1) + std::exp(-v));
}
template <typename T>
T silu(T v) {
  return v * sigmoid(v);
}
template <typename T>
T silu_grad(T v) {
  const T s = sigmoid(v);
  return s * (T(1) + v * (T(1) - s));
}
// PyTorch's softplus (beta 1, threshold 20), as mamba_ssm's kernels apply it to dt.
template <typename T>
T softplus(T v) {
  return v > T(20) ? v : std::log1p(std::exp(v));
}
template <typename T>
T softplus_grad(T v) {
  return v > T(20) ? T(1) : sigmoid(v);
}

// The convolution's input at position tt (< s) of sequence i, channel c: history or zeros
// before the first position.
template <typename T>
T conv_input(const ConvShape& sh, const T* in, const T* history, int64_t tt, int64_t i, int64_t c) {
  if (tt >= 0) return in[(tt * sh.b + i) * sh.channels + c];
  if (history == nullptr) return T(0);
  return history[(i * (sh.width - 1) + (sh.width - 1) + tt) * sh.channels + c];
}

template <typename T>
T conv_pre(const ConvShape& sh, const T* in, const T* history, const T* w, const T* bias, int64_t t,
           int64_t i, int64_t c) {
  T acc = bias ? bias[c] : T(0);
  for (int64_t k = 0; k < sh.width; ++k)
    acc += w[c * sh.width + k] * conv_input(sh, in, history, t + k - (sh.width - 1), i, c);
  return acc;
}

}  // namespace

template <typename T>
void conv_silu_forward(const ConvShape& sh, const T* in, const T* history, const T* w,
                       const T* bias, T* out) {
  const int64_t rows = sh.s * sh.b;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / sh.b, i = r % sh.b;
    for (int64_t c = 0; c < sh.channels; ++c)
      out[r * sh.channels + c] = silu(conv_pre(sh, in, history, w, bias, t, i, c));
  }
}

template <typename T>
void conv_silu_backward(const ConvShape& sh, const T* in, const T* w, const T* bias, const T* dout,
                        T* din, T* dw, T* dbias) {
  const int64_t rows = sh.s * sh.b, C = sh.channels, K = sh.width;
  std::vector<T> dpre(static_cast<size_t>(rows * C));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r / sh.b, i = r % sh.b;
    for (int64_t c = 0; c < C; ++c)
      dpre[r * C + c] = dout[r * C + c] * silu_grad(conv_pre<T>(sh, in, nullptr, w, bias, t, i, c));
  }
  // din[j] = sum_k dpre[j - k + K - 1] w[k] over the outputs that read position j.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = r / sh.b, i = r % sh.b;
    for (int64_t c = 0; c < C; ++c) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t t = j - k + K - 1;
        if (t < sh.s) acc += dpre[(t * sh.b + i) * C + c] * w[c * K + k];
      }
      din[r * C + c] = acc;
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r / sh.b, i = r % sh.b;
      const T d = dpre[r * C + c];
      if (dbias) dbias[c] += d;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t tt = t + k - (K - 1);
        if (tt >= 0) dw[c * K + k] += d * in[(tt * sh.b + i) * C + c];
      }
    }
  }
}

template <typename T>
void conv_history(const ConvShape& sh, const T* in, const T* history, T* next) {
  const int64_t keep = sh.width - 1;
  for (int64_t i = 0; i < sh.b; ++i)
    for (int64_t j = 0; j < keep; ++j)
      for (int64_t c = 0; c < sh.channels; ++c)
        next[(i * keep + j) * sh.channels + c] = conv_input(sh, in, history, sh.s - keep + j, i, c);
}

template <typename T>
void scan_forward(const ScanShape& sh, const T* x, const T* dt_raw, const T* A_log, const T* B,
                  const T* C, const T* D, const T* dt_bias, T* y, T* state, T* kept) {
  const int64_t H = sh.heads, P = sh.head_dim, N = sh.state, G = sh.groups;
  const int64_t per_group = H / G, PN = P * N;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < sh.b * H; ++bh) {
    const int64_t i = bh / H, h = bh % H, g = h / per_group;
    const T A = -std::exp(A_log[h]), Dh = D[h], bias = dt_bias[h];
    std::vector<T> S(static_cast<size_t>(PN), T(0));
    if (state) std::copy(state + bh * PN, state + (bh + 1) * PN, S.begin());
    for (int64_t t = 0; t < sh.s; ++t) {
      if (kept && t % sh.chunk == 0)
        std::copy(S.begin(), S.end(), kept + ((t / sh.chunk) * sh.b * H + bh) * PN);
      const int64_t row = t * sh.b + i;
      const T dts = softplus(dt_raw[row * H + h] + bias), a = std::exp(dts * A);
      const T* xp = x + (row * H + h) * P;
      const T* Bp = B + (row * G + g) * N;
      const T* Cp = C + (row * G + g) * N;
      T* yp = y + (row * H + h) * P;
      for (int64_t p = 0; p < P; ++p) {
        T* Sp = S.data() + p * N;
        const T xv = dts * xp[p];
        T acc = 0;
        for (int64_t n = 0; n < N; ++n) {
          Sp[n] = a * Sp[n] + xv * Bp[n];
          acc += Sp[n] * Cp[n];
        }
        yp[p] = acc + Dh * xp[p];
      }
    }
    if (state) std::copy(S.begin(), S.end(), state + bh * PN);
  }
}

template <typename T>
void scan_backward(const ScanShape& sh, const T* x, const T* dt_raw, const T* A_log, const T* B,
                   const T* C, const T* D, const T* dt_bias, const T* kept, const T* dy, T* dx,
                   T* ddt_raw, T* dB, T* dC, T* dA_log, T* dD, T* ddt_bias) {
  const int64_t H = sh.heads, P = sh.head_dim, N = sh.state, G = sh.groups;
  const int64_t per_group = H / G, PN = P * N;
  // Per (sequence, head) sums of the three per-head gradients, added in sequence order below.
  std::vector<T> pA(static_cast<size_t>(sh.b * H)), pD(pA.size()), pBias(pA.size());
  // Threads take (sequence, group) pairs: the group's heads share B and C, whose gradients
  // they add to in head order.
#pragma omp parallel for schedule(static)
  for (int64_t bg = 0; bg < sh.b * G; ++bg) {
    const int64_t i = bg / G, g = bg % G;
    for (int64_t t = 0; t < sh.s; ++t) {
      const int64_t row = t * sh.b + i;
      std::fill(dB + (row * G + g) * N, dB + (row * G + g + 1) * N, T(0));
      std::fill(dC + (row * G + g) * N, dC + (row * G + g + 1) * N, T(0));
    }
    std::vector<T> Gs(static_cast<size_t>(PN));                    // dLoss/dS_t, carried backwards
    std::vector<T> buf(static_cast<size_t>((sh.chunk + 1) * PN));  // a chunk's states
    for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
      const int64_t bh = i * H + h;
      const T A = -std::exp(A_log[h]), Dh = D[h], bias = dt_bias[h];
      T dA = 0, dDh = 0, dbias = 0;
      std::fill(Gs.begin(), Gs.end(), T(0));
      for (int64_t c = sh.chunks() - 1; c >= 0; --c) {
        const int64_t t0 = c * sh.chunk, t1 = std::min(sh.s, t0 + sh.chunk);
        // buf[k] = S_{t0 + k - 1}: the kept state, then the chunk's states recomputed.
        std::copy(kept + (c * sh.b * H + bh) * PN, kept + (c * sh.b * H + bh + 1) * PN,
                  buf.begin());
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t row = t * sh.b + i;
          const T dts = softplus(dt_raw[row * H + h] + bias), a = std::exp(dts * A);
          const T* xp = x + (row * H + h) * P;
          const T* Bp = B + (row * G + g) * N;
          const T* prev = buf.data() + (t - t0) * PN;
          T* cur = buf.data() + (t - t0 + 1) * PN;
          for (int64_t p = 0; p < P; ++p)
            for (int64_t n = 0; n < N; ++n)
              cur[p * N + n] = a * prev[p * N + n] + dts * xp[p] * Bp[n];
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t row = t * sh.b + i;
          const T v = dt_raw[row * H + h] + bias;
          const T dts = softplus(v), a = std::exp(dts * A);
          const T* xp = x + (row * H + h) * P;
          const T* Bp = B + (row * G + g) * N;
          const T* Cp = C + (row * G + g) * N;
          const T* dyp = dy + (row * H + h) * P;
          const T* St = buf.data() + (t - t0 + 1) * PN;
          const T* prev = buf.data() + (t - t0) * PN;
          T* dBp = dB + (row * G + g) * N;
          T* dCp = dC + (row * G + g) * N;
          T* dxp = dx + (row * H + h) * P;
          T ddts = 0, da = 0;
          for (int64_t p = 0; p < P; ++p) {
            T* Gp = Gs.data() + p * N;
            const T* Sp = St + p * N;
            const T* Pp = prev + p * N;
            T gb = 0, gs = 0;
            for (int64_t n = 0; n < N; ++n) {
              dCp[n] += dyp[p] * Sp[n];  // y_t = S_t C_t
              Gp[n] += dyp[p] * Cp[n];   // now dLoss/dS_t
              gb += Gp[n] * Bp[n];
              gs += Gp[n] * Pp[n];
              dBp[n] += dts * xp[p] * Gp[n];
            }
            dxp[p] = Dh * dyp[p] + dts * gb;
            ddts += xp[p] * gb;
            da += gs;
            dDh += dyp[p] * xp[p];
          }
          ddts += da * a * A;  // a = exp(dts A)
          dA += da * a * dts;
          for (int64_t k = 0; k < PN; ++k) Gs[static_cast<size_t>(k)] *= a;  // to S_{t-1}
          const T d = ddts * softplus_grad(v);
          ddt_raw[row * H + h] = d;
          dbias += d;
        }
      }
      pA[static_cast<size_t>(bh)] = dA * A;  // dA/dA_log = A
      pD[static_cast<size_t>(bh)] = dDh;
      pBias[static_cast<size_t>(bh)] = dbias;
    }
  }
  for (int64_t i = 0; i < sh.b; ++i)
    for (int64_t h = 0; h < H; ++h) {
      dA_log[h] += pA[static_cast<size_t>(i * H + h)];
      dD[h] += pD[static_cast<size_t>(i * H + h)];
      ddt_bias[h] += pBias[static_cast<size_t>(i * H + h)];
    }
}

template <typename T>
void gated_norm_forward(int64_t rows, int64_t dim, int64_t groups, double eps, const T* y,
                        const T* z, const T* w, T* out, T* rstd) {
  const int64_t gs = dim / groups;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = r * dim + g * gs;
      T ss = 0;
      for (int64_t c = 0; c < gs; ++c) {
        const T v = y[c0 + c] * silu(z[c0 + c]);
        out[c0 + c] = v;
        ss += v * v;
      }
      const T rs = T(1) / std::sqrt(ss / static_cast<T>(gs) + static_cast<T>(eps));
      rstd[r * groups + g] = rs;
      for (int64_t c = 0; c < gs; ++c) out[c0 + c] *= rs * w[g * gs + c];
    }
  }
}

template <typename T>
void gated_norm_backward(int64_t rows, int64_t dim, int64_t groups, const T* y, const T* z,
                         const T* w, const T* rstd, const T* dout, T* dy, T* dz, T* dw) {
  const int64_t gs = dim / groups;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = r * dim + g * gs;
      const T rs = rstd[r * groups + g];
      T dot = 0;  // sum of g * w * dout
      for (int64_t c = 0; c < gs; ++c)
        dot += y[c0 + c] * silu(z[c0 + c]) * w[g * gs + c] * dout[c0 + c];
      const T k = rs * rs * rs * dot / static_cast<T>(gs);
      for (int64_t c = 0; c < gs; ++c) {
        const T zv = z[c0 + c], gv = y[c0 + c] * silu(zv);
        const T dg = rs * w[g * gs + c] * dout[c0 + c] - gv * k;
        dy[c0 + c] = dg * silu(zv);
        dz[c0 + c] = dg * y[c0 + c] * silu_grad(zv);
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < dim; ++c) {
    T acc = 0;
    for (int64_t r = 0; r < rows; ++r)
      acc += y[r * dim + c] * silu(z[r * dim + c]) * rstd[r * groups + c / gs] * dout[r * dim + c];
    dw[c] += acc;
  }
}

#define MEGATRON_SSM_INSTANTIATE(T)                                                                \
  template void conv_silu_forward<T>(const ConvShape&, const T*, const T*, const T*, const T*,     \
                                     T*);                                                          \
  template void conv_silu_backward<T>(const ConvShape&, const T*, const T*, const T*, const T*,    \
                                      T*, T*, T*);                                                 \
  template void conv_history<T>(const ConvShape&, const T*, const T*, T*);                         \
  template void scan_forward<T>(const ScanShape&, const T*, const T*, const T*, const T*,          \
                                const T*, const T*, const T*, T*, T*, T*);                         \
  template void scan_backward<T>(const ScanShape&, const T*, const T*, const T*, const T*,         \
                                 const T*, const T*, const T*, const T*, const T*, T*, T*, T*, T*, \
                                 T*, T*, T*);                                                      \
  template void gated_norm_forward<T>(int64_t, int64_t, int64_t, double, const T*, const T*,       \
                                      const T*, T*, T*);                                           \
  template void gated_norm_backward<T>(int64_t, int64_t, int64_t, const T*, const T*, const T*,    \
                                       const T*, const T*, T*, T*, T*);
MEGATRON_SSM_INSTANTIATE(float)
MEGATRON_SSM_INSTANTIATE(double)
#undef MEGATRON_SSM_INSTANTIATE

}  // namespace megatron::ssm
