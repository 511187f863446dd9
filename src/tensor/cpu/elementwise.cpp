// Elementwise CPU kernels: adds, bias, GELU, tanh, SwiGLU, dropout. Memory-bound loops, OpenMP over
// elements or rows, vectorised by the compiler. Templated on float/double.
#include <algorithm>
#include <cmath>

#include "core/philox.h"
#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/gelu.h"
#include "tensor/cpu/vec_math.h"
#include "tensor/ops.h"

namespace megatron::cpu {

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  cpu::check_numel(out, a, "add");
  cpu::check_numel(a, b, "add");
  cpu::check_same_dtype(out, a, "add");
  cpu::check_same_dtype(a, b, "add");
  dispatch_float(out, "add", [&]<typename T>() {
    T* o = out.data<T>();
    const T *x = a.data<T>(), *y = b.data<T>();
    int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void add_inplace(Tensor& out, const Tensor& a) {
  cpu::check_numel(out, a, "add_inplace");
  cpu::check_same_dtype(out, a, "add_inplace");
  dispatch_float(out, "add_inplace", [&]<typename T>() {
    T* o = out.data<T>();
    const T* x = a.data<T>();
    int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] += x[i];
  });
}

void mul(Tensor& out, const Tensor& a, const Tensor& b) {
  cpu::check_numel(out, a, "mul");
  cpu::check_numel(a, b, "mul");
  cpu::check_same_dtype(out, a, "mul");
  cpu::check_same_dtype(a, b, "mul");
  dispatch_float(out, "mul", [&]<typename T>() {
    T* o = out.data<T>();
    const T *x = a.data<T>(), *y = b.data<T>();
    int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i];
  });
}

void scale_rows(Tensor& x, const Tensor& scale) {
  const int64_t n = scale.numel(), c = n > 0 ? x.numel() / n : 0;
  MEGATRON_CHECK(c * n == x.numel(), "scale_rows: ", scale.str(), " scales do not divide ", x.str(),
                 " into rows");
  cpu::check_same_dtype(x, scale, "scale_rows");
  dispatch_float(x, "scale_rows", [&]<typename T>() {
    T* p = x.data<T>();
    const T* s = scale.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j) p[r * c + j] *= s[r];
  });
}

void row_dots(Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel(), c = n > 0 ? a.numel() / n : 0;
  cpu::check_numel(a, b, "row_dots");
  MEGATRON_CHECK(c * n == a.numel(), "row_dots: ", out.str(), " is not one value per row of ",
                 a.str());
  cpu::check_same_dtype(a, b, "row_dots");
  cpu::check_same_dtype(out, a, "row_dots");
  dispatch_float(out, "row_dots", [&]<typename T>() {
    T* o = out.data<T>();
    const T *x = a.data<T>(), *y = b.data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      double s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) s += static_cast<double>(x[r * c + j]) * y[r * c + j];
      o[r] = static_cast<T>(s);
    }
  });
}

void bias_add(Tensor& x, const Tensor& bias) {
  MEGATRON_CHECK(bias.ndim() == 1 && x.dim(-1) == bias.dim(0), "bias_add: bias ", bias.str(),
                 " does not match the last dim of ", x.str());
  cpu::check_same_dtype(x, bias, "bias_add");
  dispatch_float(x, "bias_add", [&]<typename T>() {
    T* p = x.data<T>();
    const T* b = bias.data<T>();
    int64_t rows = rows_of(x), c = bias.dim(0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* row = p + r * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) row[j] += b[j];
    }
  });
}

void bias_backward(Tensor& dbias, const Tensor& dy) {
  MEGATRON_CHECK(dbias.ndim() == 1 && dy.dim(-1) == dbias.dim(0), "bias_backward: dbias ",
                 dbias.str(), " does not match the last dim of ", dy.str());
  cpu::check_same_dtype(dbias, dy, "bias_backward");
  dispatch_float(dy, "bias_backward", [&]<typename T>() {
    T* db = dbias.data<T>();
    const T* g = dy.data<T>();
    int64_t rows = rows_of(dy), c = dbias.dim(0);
    // Parallel over columns: each thread sums its columns over all rows in row order, so the
    // result does not depend on the thread count.
#pragma omp parallel for schedule(static)
    for (int64_t j0 = 0; j0 < c; j0 += 64) {
      int64_t j1 = std::min(c, j0 + 64);
      T acc[64] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const T* row = g + r * c;
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += row[j];
      }
      for (int64_t j = j0; j < j1; ++j) db[j] += acc[j - j0];
    }
  });
}

void scale_inplace(Tensor& x, double factor) {
  dispatch_float(x, "scale_inplace", [&]<typename T>() {
    T* p = x.data<T>();
    T f = static_cast<T>(factor);
    int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

void gelu_forward(Tensor& out, const Tensor& x, bool tanh_approx) {
  cpu::check_numel(out, x, "gelu_forward");
  cpu::check_same_dtype(out, x, "gelu_forward");
  dispatch_float(x, "gelu_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    int64_t n = x.numel();
    if (tanh_approx) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = gelu_of<true>(in[i]);
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = gelu_of<false>(in[i]);
    }
  });
}

void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, bool tanh_approx) {
  cpu::check_numel(dx, x, "gelu_backward");
  cpu::check_numel(dout, x, "gelu_backward");
  dispatch_float(x, "gelu_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *in = x.data<T>();
    int64_t n = x.numel();
    if (tanh_approx) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = g[i] * gelu_grad_of<true>(in[i]);
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] = g[i] * gelu_grad_of<false>(in[i]);
    }
  });
}

void tanh_forward(Tensor& out, const Tensor& x) {
  cpu::check_numel(out, x, "tanh_forward");
  cpu::check_same_dtype(out, x, "tanh_forward");
  dispatch_float(x, "tanh_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = cpu::vtanh(in[i]);
  });
}

void tanh_backward(Tensor& dx, const Tensor& dout, const Tensor& y) {
  cpu::check_numel(dx, y, "tanh_backward");
  cpu::check_numel(dout, y, "tanh_backward");
  cpu::check_same_dtype(dx, y, "tanh_backward");
  cpu::check_same_dtype(dout, y, "tanh_backward");
  dispatch_float(y, "tanh_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *out = y.data<T>();
    const int64_t n = y.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = g[i] * (static_cast<T>(1) - out[i] * out[i]);
  });
}

void squared_relu_forward(Tensor& out, const Tensor& x) {
  cpu::check_numel(out, x, "squared_relu_forward");
  cpu::check_same_dtype(out, x, "squared_relu_forward");
  dispatch_float(x, "squared_relu_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T r = in[i] > static_cast<T>(0) ? in[i] : static_cast<T>(0);
      o[i] = r * r;
    }
  });
}

void squared_relu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  cpu::check_numel(dx, x, "squared_relu_backward");
  cpu::check_numel(dout, x, "squared_relu_backward");
  cpu::check_same_dtype(dx, x, "squared_relu_backward");
  cpu::check_same_dtype(dout, x, "squared_relu_backward");
  dispatch_float(x, "squared_relu_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *in = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      d[i] = in[i] > static_cast<T>(0) ? static_cast<T>(2) * in[i] * g[i] : static_cast<T>(0);
    }
  });
}

void quick_gelu_forward(Tensor& out, const Tensor& x) {
  cpu::check_numel(out, x, "quick_gelu_forward");
  cpu::check_same_dtype(out, x, "quick_gelu_forward");
  dispatch_float(x, "quick_gelu_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      o[i] = in[i] / (static_cast<T>(1) + cpu::vexp(static_cast<T>(-1.702) * in[i]));
    }
  });
}

void quick_gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  cpu::check_numel(dx, x, "quick_gelu_backward");
  cpu::check_numel(dout, x, "quick_gelu_backward");
  cpu::check_same_dtype(dx, x, "quick_gelu_backward");
  cpu::check_same_dtype(dout, x, "quick_gelu_backward");
  dispatch_float(x, "quick_gelu_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *in = x.data<T>();
    const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const T v = in[i];
      const T s = static_cast<T>(1) / (static_cast<T>(1) + cpu::vexp(static_cast<T>(-1.702) * v));
      d[i] = g[i] * (s + static_cast<T>(1.702) * v * s * (static_cast<T>(1) - s));
    }
  });
}

void swiglu_forward(Tensor& out, const Tensor& x) {
  int64_t f = out.dim(-1);
  MEGATRON_CHECK(x.dim(-1) == 2 * f && rows_of(x) == rows_of(out), "swiglu_forward: input ",
                 x.str(), " must be [rows, 2f] for output ", out.str());
  dispatch_float(x, "swiglu_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    int64_t rows = rows_of(x);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = in + r * 2 * f;
      const T* up = gate + f;
      T* orow = o + r * f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) {
        T a = gate[j];
        orow[j] = a / (1 + cpu::vexp(-a)) * up[j];
      }
    }
  });
}

namespace {
// quick_geglu's clamps (clamp > 0): the gate's upper bound, up's symmetric one.
template <typename T>
inline T clamp_gate(T g, T clamp) {
  return clamp > 0 && g > clamp ? clamp : g;
}
template <typename T>
inline T clamp_up(T u, T clamp) {
  return clamp > 0 ? std::clamp(u, -clamp, clamp) : u;
}
}  // namespace

void quick_geglu_forward(Tensor& out, const Tensor& x, double offset, double clamp) {
  const int64_t f = x.dim(-1) / 2;
  dispatch_float(x, "quick_geglu_forward", [&]<typename T>() {
    T* o = out.data<T>();
    const T* in = x.data<T>();
    const T off = static_cast<T>(offset), lim = static_cast<T>(clamp);
    const int64_t rows = rows_of(x);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = in + r * 2 * f;
      const T* up = gate + f;
      T* orow = o + r * f;
      for (int64_t j = 0; j < f; ++j) {
        const T g = clamp_gate(gate[j], lim);
        orow[j] = g / (1 + cpu::vexp(static_cast<T>(-1.702) * g)) * (clamp_up(up[j], lim) + off);
      }
    }
  });
}

void quick_geglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x, double offset,
                          double clamp) {
  const int64_t f = x.dim(-1) / 2;
  dispatch_float(x, "quick_geglu_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *in = x.data<T>();
    const T off = static_cast<T>(offset), lim = static_cast<T>(clamp);
    const int64_t rows = rows_of(x);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = in + r * 2 * f;
      const T* up = gate + f;
      const T* grow = g + r * f;
      T* dgate = d + r * 2 * f;
      T* dup = dgate + f;
      for (int64_t j = 0; j < f; ++j) {
        const T a = clamp_gate(gate[j], lim), u = clamp_up(up[j], lim);
        const T s = 1 / (1 + cpu::vexp(static_cast<T>(-1.702) * a));
        const bool gate_free = !(lim > 0) || gate[j] <= lim;
        const bool up_free = !(lim > 0) || (up[j] >= -lim && up[j] <= lim);
        dup[j] = up_free ? grow[j] * a * s : T(0);
        dgate[j] =
            gate_free ? grow[j] * (u + off) * (s + static_cast<T>(1.702) * a * s * (1 - s)) : T(0);
      }
    }
  });
}

void swiglu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  int64_t f = dout.dim(-1);
  MEGATRON_CHECK(x.dim(-1) == 2 * f && dx.numel() == x.numel(), "swiglu_backward: shapes ",
                 dx.str(), ", ", dout.str(), ", ", x.str());
  dispatch_float(x, "swiglu_backward", [&]<typename T>() {
    T* d = dx.data<T>();
    const T *g = dout.data<T>(), *in = x.data<T>();
    int64_t rows = rows_of(x);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = in + r * 2 * f;
      const T* up = gate + f;
      const T* grow = g + r * f;
      T* dgate = d + r * 2 * f;
      T* dup = dgate + f;
#pragma omp simd
      for (int64_t j = 0; j < f; ++j) {
        T a = gate[j];
        T sig = 1 / (1 + cpu::vexp(-a));
        T silu = a * sig;
        dup[j] = grow[j] * silu;
        dgate[j] = grow[j] * up[j] * sig * (1 + a * (1 - sig));
      }
    }
  });
}

namespace {
template <typename T>
void dropout_apply(T* out, const T* in, int64_t n, float p, uint64_t seed, uint64_t stream,
                   uint64_t offset) {
  T scale = static_cast<T>(1.0 / (1.0 - p));
  // Blocks of 4 counters share one Philox call (4 lanes); element i has counter offset + i, so
  // with an offset that is not a multiple of 4 the first and last blocks are partial.
  const auto first = static_cast<int64_t>(offset >> 2);
  const auto last = static_cast<int64_t>((offset + static_cast<uint64_t>(n) + 3) >> 2);
  const auto off = static_cast<int64_t>(offset);
#pragma omp parallel for schedule(static)
  for (int64_t blk = first; blk < last; ++blk) {
    auto b = Philox::block(seed, static_cast<uint64_t>(blk), stream);
    const int64_t g0 = std::max(blk * 4, off), g1 = std::min(blk * 4 + 4, off + n);
    for (int64_t g = g0; g < g1; ++g) {
      float u = static_cast<float>(b[g - blk * 4] >> 8) * (1.0f / 16777216.0f);
      out[g - off] = u >= p ? in[g - off] * scale : static_cast<T>(0);
    }
  }
}
}  // namespace

void dropout_forward(Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset) {
  cpu::check_numel(out, x, "dropout_forward");
  MEGATRON_CHECK(p >= 0 && p < 1, "dropout probability must be in [0, 1), got ", p);
  dispatch_float(x, "dropout_forward", [&]<typename T>() {
    dropout_apply(out.data<T>(), x.data<T>(), x.numel(), p, seed, stream, offset);
  });
}

void dropout_backward(Tensor& dx, const Tensor& dout, float p, uint64_t seed, uint64_t stream,
                      uint64_t offset) {
  cpu::check_numel(dx, dout, "dropout_backward");
  dispatch_float(dout, "dropout_backward", [&]<typename T>() {
    dropout_apply(dx.data<T>(), dout.data<T>(), dout.numel(), p, seed, stream, offset);
  });
}

}  // namespace megatron::cpu
