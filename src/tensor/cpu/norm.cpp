// LayerNorm and RMSNorm over the last dim, forward and backward. One row per OpenMP iteration;
// statistics accumulated in double whatever T is (rows are short, and this keeps f32 results
// within rounding of the fp64 reference), in vector lanes (`omp simd reduction`: a fixed order
// for a given build; one serial chain of double additions ran LayerNorm at a third of the memory
// bandwidth). Parameter gradients are reduced per thread, then summed in thread order so results
// do not depend on scheduling.
#include <cmath>
#include <vector>

#include <omp.h>

#include "tensor/cpu/cpu_ops.h"
#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/half_store.h"
#include "tensor/ops.h"

namespace megatron::cpu {
using cpu::dispatch_float;
using cpu::rows_of;

namespace {
// Sums per-thread partial parameter gradients (nthreads x h) into dst, in thread order.
template <typename T>
void reduce_partials(T* dst, const std::vector<double>& partial, int nthreads, int64_t h) {
  for (int64_t j = 0; j < h; ++j) {
    double s = 0;
    for (int t = 0; t < nthreads; ++t) s += partial[static_cast<size_t>(t * h + j)];
    dst[j] += static_cast<T>(s);
  }
}
}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                       const Tensor& weight, const Tensor& bias, float eps) {
  int64_t h = x.dim(-1), rows = rows_of(x);
  cpu::check_numel(out, x, "layernorm_forward");
  check_shape(weight, {h}, "layernorm_forward weight");
  check_shape(bias, {h}, "layernorm_forward bias");
  check_shape(mean, {rows}, "layernorm_forward mean");
  check_shape(rstd, {rows}, "layernorm_forward rstd");
  dispatch_float(x, "layernorm_forward", [&]<typename T>() {
    dispatch_out<T>(out, "layernorm_forward", [&]<typename O>() {
      const T *in = x.data<T>(), *w = weight.data<T>(), *b = bias.data<T>();
      T *mu = mean.data<T>(), *rs = rstd.data<T>();
      StoredAs<O>* o = stored_ptr(out.data<O>());
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = in + r * h;
        double s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < h; ++j) s += xr[j];
        double m = s / static_cast<double>(h);
        double v = 0;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < h; ++j) {
          double d = xr[j] - m;
          v += d * d;
        }
        double inv = 1.0 / std::sqrt(v / static_cast<double>(h) + eps);
        T mt = static_cast<T>(m), it = static_cast<T>(inv);
        StoredAs<O>* orow = o + r * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) orow[j] = stored_value<O>((xr[j] - mt) * it * w[j] + b[j]);
        mu[r] = mt;
        rs[r] = it;
      }
    });
  });
}

void layernorm_backward(Tensor& dx, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                        const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd) {
  int64_t h = x.dim(-1), rows = rows_of(x);
  cpu::check_numel(dx, x, "layernorm_backward");
  cpu::check_numel(dout, x, "layernorm_backward");
  check_shape(dweight, {h}, "layernorm_backward dweight");
  check_shape(dbias, {h}, "layernorm_backward dbias");
  dispatch_float(x, "layernorm_backward", [&]<typename T>() {
    const T *in = x.data<T>(), *g = dout.data<T>(), *w = weight.data<T>();
    const T *mu = mean.data<T>(), *rs = rstd.data<T>();
    T* d = dx.data<T>();
    int nthreads = omp_get_max_threads();
    std::vector<double> pw(static_cast<size_t>(nthreads * h), 0.0), pb(pw.size(), 0.0);
#pragma omp parallel
    {
      int tid = omp_get_thread_num();
      double* my_w = pw.data() + tid * h;
      double* my_b = pb.data() + tid * h;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T *xr = in + r * h, *gr = g + r * h;
        T m = mu[r], s = rs[r];
        // dxhat = dout * w; dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        double sum_dxhat = 0, sum_dxhat_xhat = 0;
#pragma omp simd reduction(+ : sum_dxhat, sum_dxhat_xhat)
        for (int64_t j = 0; j < h; ++j) {
          double xhat = (xr[j] - m) * s;
          double dxhat = static_cast<double>(gr[j]) * w[j];
          sum_dxhat += dxhat;
          sum_dxhat_xhat += dxhat * xhat;
          my_w[j] += static_cast<double>(gr[j]) * xhat;
          my_b[j] += gr[j];
        }
        T a = static_cast<T>(sum_dxhat / static_cast<double>(h));
        T c = static_cast<T>(sum_dxhat_xhat / static_cast<double>(h));
        T* dr = d + r * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) {
          T xhat = (xr[j] - m) * s;
          dr[j] = s * (gr[j] * w[j] - a - xhat * c);
        }
      }
    }
    reduce_partials(dweight.data<T>(), pw, nthreads, h);
    reduce_partials(dbias.data<T>(), pb, nthreads, h);
  });
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& weight, float eps) {
  int64_t h = x.dim(-1), rows = rows_of(x);
  cpu::check_numel(out, x, "rmsnorm_forward");
  check_shape(weight, {h}, "rmsnorm_forward weight");
  check_shape(rstd, {rows}, "rmsnorm_forward rstd");
  dispatch_float(x, "rmsnorm_forward", [&]<typename T>() {
    dispatch_out<T>(out, "rmsnorm_forward", [&]<typename O>() {
      const T *in = x.data<T>(), *w = weight.data<T>();
      T* rs = rstd.data<T>();
      StoredAs<O>* o = stored_ptr(out.data<O>());
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = in + r * h;
        double ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < h; ++j) ss += static_cast<double>(xr[j]) * xr[j];
        T inv = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(h) + eps));
        StoredAs<O>* orow = o + r * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) orow[j] = stored_value<O>(xr[j] * inv * w[j]);
        rs[r] = inv;
      }
    });
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dweight, const Tensor& dout, const Tensor& x,
                      const Tensor& weight, const Tensor& rstd) {
  int64_t h = x.dim(-1), rows = rows_of(x);
  cpu::check_numel(dx, x, "rmsnorm_backward");
  cpu::check_numel(dout, x, "rmsnorm_backward");
  check_shape(dweight, {h}, "rmsnorm_backward dweight");
  dispatch_float(x, "rmsnorm_backward", [&]<typename T>() {
    const T *in = x.data<T>(), *g = dout.data<T>(), *w = weight.data<T>(), *rs = rstd.data<T>();
    T* d = dx.data<T>();
    int nthreads = omp_get_max_threads();
    std::vector<double> pw(static_cast<size_t>(nthreads * h), 0.0);
#pragma omp parallel
    {
      double* my_w = pw.data() + omp_get_thread_num() * h;
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const T *xr = in + r * h, *gr = g + r * h;
        T s = rs[r];
        // dx = rstd * (dout*w - xhat * mean(dout*w*xhat)), xhat = x * rstd
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < h; ++j) {
          double xhat = static_cast<double>(xr[j]) * s;
          dot += static_cast<double>(gr[j]) * w[j] * xhat;
          my_w[j] += static_cast<double>(gr[j]) * xhat;
        }
        T c = static_cast<T>(dot / static_cast<double>(h));
        T* dr = d + r * h;
#pragma omp simd
        for (int64_t j = 0; j < h; ++j) dr[j] = s * (gr[j] * w[j] - xr[j] * s * c);
      }
    }
    reduce_partials(dweight.data<T>(), pw, nthreads, h);
  });
}

}  // namespace megatron::cpu
