// Mamba-2's convolution, scan and gated norm as loops over plain arrays (see ssm_kernels.h).
// Threads split sequences and heads (or channels), never a sum: every result is the same bits on
// any thread count.
#include "transformer/mamba/ssm_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/vec_math.h"

namespace megatron::ssm {

namespace {

// cpu::vexp: an exp GCC vectorises (float; the double overload is std::exp, so the finite
// differences of the f64 path stay exact).
template <typename T>
T sigmoid(T v) {
  return T(1) / (T(1) + cpu::vexp(-v));
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

// The weights as [width, channels], so that the inner loops run over contiguous channels.
template <typename T>
std::vector<T> transposed_weights(const ConvShape& sh, const T* w) {
  std::vector<T> wt(static_cast<size_t>(sh.width * sh.channels));
  for (int64_t c = 0; c < sh.channels; ++c)
    for (int64_t k = 0; k < sh.width; ++k)
      wt[static_cast<size_t>(k * sh.channels + c)] = w[c * sh.width + k];
  return wt;
}

// The first position that output t of sequence i reads: its document's start with packed
// documents, else any (the history's or zeros before position 0).
inline int64_t first_read(const ConvShape& sh, int64_t t, int64_t i) {
  return sh.doc_start ? sh.doc_start[i * sh.s + t] : -sh.width;
}

// The convolution's input row for position tt of sequence i: the input, the history before
// position 0, or null (zeros).
template <typename T>
const T* conv_row(const ConvShape& sh, const T* in, const T* history, int64_t tt, int64_t i) {
  if (tt >= 0) return in + (tt * sh.b + i) * sh.channels;
  if (history == nullptr) return nullptr;
  return history + (i * (sh.width - 1) + (sh.width - 1) + tt) * sh.channels;
}

// pre[c] = bias[c] + sum_k w[c, k] in[t + k - (K - 1), c] for one row.
template <typename T>
void conv_pre_row(const ConvShape& sh, const T* in, const T* history, const T* wt, const T* bias,
                  int64_t t, int64_t i, T* pre) {
  const int64_t C = sh.channels;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) pre[c] = bias ? bias[c] : T(0);
  const int64_t lo = first_read(sh, t, i);
  for (int64_t k = 0; k < sh.width; ++k) {
    const int64_t tt = t + k - (sh.width - 1);
    const T* src = tt < lo ? nullptr : conv_row(sh, in, history, tt, i);
    if (src == nullptr) continue;
    const T* wk = wt + k * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) pre[c] += wk[c] * src[c];
  }
}

}  // namespace

template <typename T>
void conv_silu_forward(const ConvShape& sh, const T* in, const T* history, const T* w,
                       const T* bias, T* out) {
  const int64_t rows = sh.s * sh.b, C = sh.channels;
  const std::vector<T> wt = transposed_weights(sh, w);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* o = out + r * C;
    conv_pre_row(sh, in, history, wt.data(), bias, r / sh.b, r % sh.b, o);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = silu(o[c]);
  }
}

template <typename T>
void conv_silu_backward(const ConvShape& sh, const T* in, const T* w, const T* bias, const T* dout,
                        T* din, T* dw, T* dbias) {
  const int64_t rows = sh.s * sh.b, C = sh.channels, K = sh.width;
  const std::vector<T> wt = transposed_weights(sh, w);
  std::vector<T> dpre(static_cast<size_t>(rows * C));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* d = dpre.data() + r * C;
    conv_pre_row<T>(sh, in, nullptr, wt.data(), bias, r / sh.b, r % sh.b, d);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) d[c] = dout[r * C + c] * silu_grad(d[c]);
  }
  // din[j] = sum_k dpre[j - k + K - 1] w[k] over the outputs that read position j.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = r / sh.b, i = r % sh.b;
    T* o = din + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = T(0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = j - k + K - 1;
      if (t >= sh.s || j < first_read(sh, t, i)) continue;
      const T* d = dpre.data() + (t * sh.b + i) * C;
      const T* wk = wt.data() + k * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += d[c] * wk[c];
    }
  }
  // dw and dbias: blocks of channels per thread, rows summed in order.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, n = std::min(kBlock, C - c0);
    std::vector<T> acc(static_cast<size_t>((K + 1) * kBlock), T(0));  // [K] dw rows, then dbias
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = r / sh.b, i = r % sh.b;
      const T* d = dpre.data() + r * C + c0;
      T* db = acc.data() + K * kBlock;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) db[c] += d[c];
      for (int64_t k = 0; k < K; ++k) {
        const int64_t tt = t + k - (K - 1);
        if (tt < 0 || tt < first_read(sh, t, i)) continue;
        const T* x = in + (tt * sh.b + i) * C + c0;
        T* a = acc.data() + k * kBlock;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) a[c] += d[c] * x[c];
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      if (dbias) dbias[c0 + c] += acc[static_cast<size_t>(K * kBlock + c)];
      for (int64_t k = 0; k < K; ++k)
        dw[(c0 + c) * K + k] += acc[static_cast<size_t>(k * kBlock + c)];
    }
  }
}

template <typename T>
void conv_history(const ConvShape& sh, const T* in, const T* history, T* next) {
  const int64_t keep = sh.width - 1;
  for (int64_t i = 0; i < sh.b; ++i)
    for (int64_t j = 0; j < keep; ++j) {
      const T* src = conv_row(sh, in, history, sh.s - keep + j, i);
      T* dst = next + (i * keep + j) * sh.channels;
      if (src) {
        std::copy(src, src + sh.channels, dst);
      } else {
        std::fill(dst, dst + sh.channels, T(0));
      }
    }
}

// The state's decay into position t of sequence i: exp(dt A), or 0 where a packed document
// starts (the state restarts; every gradient through the decay then vanishes with it).
template <typename T>
T decay(const ScanShape& sh, int64_t t, int64_t i, T dts, T A) {
  if (sh.doc_start && t > 0 && sh.doc_start[i * sh.s + t] == t) return T(0);
  return std::exp(dts * A);
}

// [rows, cols] -> [cols, rows].
template <typename T>
void transpose(const T* src, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
}

// The forward holds each head's state as [state, head_dim] (the kept states too): the update and
// y_t = S_t C_t then run over contiguous head_dim lanes with no horizontal sums (measured 2.6x
// faster than [head_dim, state], whose y needs one sum per channel). The carried state is
// [head_dim, state] (Megatron's layout), transposed on the way in and out.
template <typename T>
void scan_forward(const ScanShape& sh, const T* x, const T* dt_raw, const T* A_log, const T* B,
                  const T* C, const T* D, const T* dt_bias, T* y, T* state, T* kept) {
  const int64_t H = sh.heads, P = sh.head_dim, N = sh.state, G = sh.groups;
  const int64_t per_group = H / G, PN = P * N;
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < sh.b * H; ++bh) {
    const int64_t i = bh / H, h = bh % H, g = h / per_group;
    const T A = -std::exp(A_log[h]), Dh = D[h], bias = dt_bias[h];
    std::vector<T> S(static_cast<size_t>(PN), T(0)), xv(static_cast<size_t>(P)),
        acc(static_cast<size_t>(P));
    if (state) transpose(state + bh * PN, P, N, S.data());
    for (int64_t t = 0; t < sh.s; ++t) {
      if (kept && t % sh.chunk == 0)
        std::copy(S.begin(), S.end(), kept + ((t / sh.chunk) * sh.b * H + bh) * PN);
      const int64_t row = t * sh.b + i;
      const T dts = softplus(dt_raw[row * H + h] + bias), a = decay(sh, t, i, dts, A);
      const T* xp = x + (row * H + h) * P;
      const T* Bp = B + (row * G + g) * N;
      const T* Cp = C + (row * G + g) * N;
      T* xs = xv.data();
      T* ac = acc.data();
#pragma omp simd
      for (int64_t p = 0; p < P; ++p) {
        xs[p] = dts * xp[p];
        ac[p] = Dh * xp[p];
      }
      for (int64_t n = 0; n < N; ++n) {
        T* Sn = S.data() + n * P;
        const T bn = Bp[n], cn = Cp[n];
#pragma omp simd
        for (int64_t p = 0; p < P; ++p) {
          Sn[p] = a * Sn[p] + xs[p] * bn;
          ac[p] += Sn[p] * cn;
        }
      }
      std::copy(acc.begin(), acc.end(), y + (row * H + h) * P);
    }
    if (state) transpose(S.data(), N, P, state + bh * PN);
  }
}

// One backward step's arrays for one head: the states S_t and S_{t-1} and the carried gradient
// ([head_dim, state] each), B_t and C_t of its group, their gradients and da's lanes ([state]).
template <typename T>
struct StepRows {
  const T *S, *prev;
  T* G;
  const T *B, *C;
  T *dC, *dB, *da;
  int64_t N;
  T a;
};

// Rows p .. p + 3 (four channels) of one backward step: G += dy C^T (the gradient of S_t), then
// dC += S_t^T dy, dB += G^T (dt x), da += <G, S_{t-1}>, gb = G B (into dx and dt), and G *= a
// (the gradient's share for S_{t-1}); one row at a time for a remainder (rows4 false).
template <typename T>
void backward_rows(const StepRows<T>& r, int64_t p, bool rows4, const T* dy, const T* x, T dts,
                   T Dh, T* dx, T& ddts, T& dD) {
  const int64_t N = r.N;
  const int J = rows4 ? 4 : 1;
  T gb[4] = {0, 0, 0, 0};
  if (rows4) {
    const T y0 = dy[p], y1 = dy[p + 1], y2 = dy[p + 2], y3 = dy[p + 3];
    const T x0 = dts * x[p], x1 = dts * x[p + 1], x2 = dts * x[p + 2], x3 = dts * x[p + 3];
    const T *S0 = r.S + p * N, *S1 = S0 + N, *S2 = S1 + N, *S3 = S2 + N;
    const T *P0 = r.prev + p * N, *P1 = P0 + N, *P2 = P1 + N, *P3 = P2 + N;
    T *G0 = r.G + p * N, *G1 = G0 + N, *G2 = G1 + N, *G3 = G2 + N;
    T gb0 = 0, gb1 = 0, gb2 = 0, gb3 = 0;
    const T a = r.a;
#pragma omp simd reduction(+ : gb0, gb1, gb2, gb3)
    for (int64_t n = 0; n < N; ++n) {
      const T c = r.C[n], b = r.B[n];
      const T g0 = G0[n] + y0 * c, g1 = G1[n] + y1 * c, g2 = G2[n] + y2 * c, g3 = G3[n] + y3 * c;
      r.dC[n] += y0 * S0[n] + y1 * S1[n] + y2 * S2[n] + y3 * S3[n];
      r.dB[n] += x0 * g0 + x1 * g1 + x2 * g2 + x3 * g3;
      r.da[n] += g0 * P0[n] + g1 * P1[n] + g2 * P2[n] + g3 * P3[n];
      gb0 += g0 * b;
      gb1 += g1 * b;
      gb2 += g2 * b;
      gb3 += g3 * b;
      G0[n] = g0 * a;
      G1[n] = g1 * a;
      G2[n] = g2 * a;
      G3[n] = g3 * a;
    }
    gb[0] = gb0;
    gb[1] = gb1;
    gb[2] = gb2;
    gb[3] = gb3;
  } else {
    const T y0 = dy[p], x0 = dts * x[p];
    const T* S0 = r.S + p * N;
    const T* P0 = r.prev + p * N;
    T* G0 = r.G + p * N;
    T gb0 = 0;
    const T a = r.a;
#pragma omp simd reduction(+ : gb0)
    for (int64_t n = 0; n < N; ++n) {
      const T g0 = G0[n] + y0 * r.C[n];
      r.dC[n] += y0 * S0[n];
      r.dB[n] += x0 * g0;
      r.da[n] += g0 * P0[n];
      gb0 += g0 * r.B[n];
      G0[n] = g0 * a;
    }
    gb[0] = gb0;
  }
  for (int j = 0; j < J; ++j) {
    dx[p + j] = Dh * dy[p + j] + dts * gb[j];
    ddts += x[p + j] * gb[j];
    dD += dy[p + j] * x[p + j];
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
    std::vector<T> da_v(static_cast<size_t>(N));                   // da's lanes
    for (int64_t h = g * per_group; h < (g + 1) * per_group; ++h) {
      const int64_t bh = i * H + h;
      const T A = -std::exp(A_log[h]), Dh = D[h], bias = dt_bias[h];
      T dA = 0, dDh = 0, dbias = 0;
      std::fill(Gs.begin(), Gs.end(), T(0));
      for (int64_t c = sh.chunks() - 1; c >= 0; --c) {
        const int64_t t0 = c * sh.chunk, t1 = std::min(sh.s, t0 + sh.chunk);
        // buf[k] = S_{t0 + k - 1} as [head_dim, state]: the kept state (forward's [state,
        // head_dim]), then the chunk's states recomputed.
        transpose(kept + (c * sh.b * H + bh) * PN, N, P, buf.data());
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t row = t * sh.b + i;
          const T dts = softplus(dt_raw[row * H + h] + bias), a = decay(sh, t, i, dts, A);
          const T* xp = x + (row * H + h) * P;
          const T* Bp = B + (row * G + g) * N;
          const T* prev = buf.data() + (t - t0) * PN;
          T* cur = buf.data() + (t - t0 + 1) * PN;
          for (int64_t p = 0; p < P; ++p) {
            const T xv = dts * xp[p];
#pragma omp simd
            for (int64_t n = 0; n < N; ++n) cur[p * N + n] = a * prev[p * N + n] + xv * Bp[n];
          }
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t row = t * sh.b + i;
          const T v = dt_raw[row * H + h] + bias;
          const T dts = softplus(v), a = decay(sh, t, i, dts, A);
          const T* xp = x + (row * H + h) * P;
          const T* Bp = B + (row * G + g) * N;
          const T* Cp = C + (row * G + g) * N;
          const T* dyp = dy + (row * H + h) * P;
          const T* St = buf.data() + (t - t0 + 1) * PN;
          const T* prev = buf.data() + (t - t0) * PN;
          T* dBp = dB + (row * G + g) * N;
          T* dCp = dC + (row * G + g) * N;
          T* dxp = dx + (row * H + h) * P;
          T ddts = 0;
          std::fill(da_v.begin(), da_v.end(), T(0));
          // Channels in blocks of 4 rows of the state: dC, dB and da's lanes are read and
          // written once per block, and the carried gradient takes its decay a in the same pass.
          const StepRows<T> rows{St, prev, Gs.data(), Bp, Cp, dCp, dBp, da_v.data(), N, a};
          int64_t p = 0;
          for (; p + 4 <= P; p += 4)
            backward_rows<T>(rows, p, true, dyp, xp, dts, Dh, dxp, ddts, dDh);
          for (; p < P; ++p) backward_rows<T>(rows, p, false, dyp, xp, dts, Dh, dxp, ddts, dDh);
          T da = 0;
          for (int64_t n = 0; n < N; ++n) da += da_v[static_cast<size_t>(n)];
          ddts += da * a * A;  // a = exp(dts A) (or 0 at a document start)
          dA += da * a * dts;
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
#pragma omp simd reduction(+ : ss)
      for (int64_t c = 0; c < gs; ++c) {
        const T v = y[c0 + c] * silu(z[c0 + c]);
        out[c0 + c] = v;
        ss += v * v;
      }
      const T rs = T(1) / std::sqrt(ss / static_cast<T>(gs) + static_cast<T>(eps));
      rstd[r * groups + g] = rs;
      const T* wg = w + g * gs;
#pragma omp simd
      for (int64_t c = 0; c < gs; ++c) out[c0 + c] *= rs * wg[c];
    }
  }
}

template <typename T>
void gated_norm_backward(int64_t rows, int64_t dim, int64_t groups, const T* y, const T* z,
                         const T* w, const T* rstd, const T* dout, T* dy, T* dz, T* dw) {
  const int64_t gs = dim / groups;
  // The normalised g (before the weight), for dw below.
  std::vector<T> ghat(static_cast<size_t>(rows * dim));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = r * dim + g * gs;
      const T rs = rstd[r * groups + g];
      const T* wg = w + g * gs;
      T* gh = ghat.data() + c0;
      T dot = 0;  // sum of g * w * dout
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < gs; ++c) {
        const T zv = z[c0 + c], sg = sigmoid(zv);
        // dy and dz hold sigmoid(z) and silu'(z) until the second pass.
        dy[c0 + c] = sg;
        dz[c0 + c] = sg * (T(1) + zv * (T(1) - sg));
        const T gv = y[c0 + c] * zv * sg;
        gh[c] = gv;
        dot += gv * wg[c] * dout[c0 + c];
      }
      const T k = rs * rs * rs * dot / static_cast<T>(gs);
#pragma omp simd
      for (int64_t c = 0; c < gs; ++c) {
        const T zv = z[c0 + c];
        const T dg = rs * wg[c] * dout[c0 + c] - gh[c] * k;
        const T silu_z = zv * dy[c0 + c];
        dz[c0 + c] = dg * y[c0 + c] * dz[c0 + c];
        dy[c0 + c] = dg * silu_z;
        gh[c] *= rs;
      }
    }
  }
  // dw: blocks of channels per thread, rows summed in order.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (dim + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, n = std::min(kBlock, dim - c0);
    T acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* gh = ghat.data() + r * dim + c0;
      const T* d = dout + r * dim + c0;
#pragma omp simd
      for (int64_t c = 0; c < n; ++c) acc[c] += gh[c] * d[c];
    }
    for (int64_t c = 0; c < n; ++c) dw[c0 + c] += acc[c];
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
