// GEMMs on the CUDA device through cuBLASLt. The project's tensors are row-major and cuBLAS is
// column-major: a row-major [r, c] matrix is, as stored, the column-major [c, r] matrix of its
// transpose, so out = op(a) op(b) is computed as out^T = op(b)^T op(a)^T with b's storage as
// cuBLAS's first operand. f32 runs in plain f32 (CUBLAS_COMPUTE_32F: no TF32 unless --tf32, so
// results match the CPU device to f32 rounding); bf16 and f16 inputs accumulate in f32 into an
// f32 output; f64 in f64.
#include <cuda_runtime.h>

#include <mutex>

#include "core/error.h"
#include "tensor/cuda/cublaslt.h"
#include "tensor/cuda/cuda_ops.h"
#include "tensor/cuda/kernels.h"

namespace megatron::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "cuBLAS not initialised";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "cuBLAS allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "cuBLAS invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "cuBLAS architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "cuBLAS execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "cuBLAS: not supported";
    default:
      return "cuBLAS error";
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) cuda_fail(what, status_name(s));
}

cublasLtHandle_t handle() {
  thread_local cublasLtHandle_t h = [] {
    cublasLtHandle_t created = nullptr;
    check(cublaslt().create(&created), "cublasLtCreate");
    return created;
  }();
  return h;
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF64:
      return CUDA_R_64F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      MEGATRON_CHECK(false, "matmul: no GEMM for dtype ", dtype_name(t));
  }
  return CUDA_R_32F;
}

// RAII holders for the cuBLASLt descriptors of one call.
struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld) {
    check(cublaslt().layout_create(&d, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                                   ld),
          "cublasLtMatrixLayoutCreate");
  }
  ~Layout() { cublaslt().layout_destroy(d); }
};

}  // namespace

void matmul(Tensor& out, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, float beta) {
  MEGATRON_CHECK(a.dtype() == b.dtype(), "matmul: a is ", dtype_name(a.dtype()), ", b is ",
                 dtype_name(b.dtype()));
  const bool f64 = a.dtype() == DType::kF64;
  MEGATRON_CHECK(out.dtype() == (f64 ? DType::kF64 : DType::kF32), "matmul: out must be ",
                 f64 ? "f64" : "f32", ", got ", out.str());
  MEGATRON_CHECK(a.ndim() >= 1 && b.ndim() >= 1, "matmul: operands need a dimension");
  const int64_t a_rows = a.numel() / a.dim(-1), a_cols = a.dim(-1);
  const int64_t b_rows = b.numel() / b.dim(-1), b_cols = b.dim(-1);
  const int64_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
  const int64_t Kb = trans_b ? b_cols : b_rows, N = trans_b ? b_rows : b_cols;
  MEGATRON_CHECK(K == Kb && out.numel() == M * N, "matmul: ", a.str(), (trans_a ? "^T" : ""), " @ ",
                 b.str(), (trans_b ? "^T" : ""), " into ", out.str());
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (beta == 0.0f) out.zero();
    return;
  }
  const cudaDataType_t in_t = data_type(a.dtype()), out_t = f64 ? CUDA_R_64F : CUDA_R_32F;
  cublasLtMatmulDesc_t desc = nullptr;
  const bool tf32 = a.dtype() == DType::kF32 && cuda_tf32();
  const cublasComputeType_t compute = f64    ? CUBLAS_COMPUTE_64F
                                      : tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                             : CUBLAS_COMPUTE_32F;
  check(cublaslt().desc_create(&desc, compute, f64 ? CUDA_R_64F : CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(
      cublaslt().desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
      "matmul transa");
  check(cublaslt().desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                      sizeof(op_second)),
        "matmul transb");
  // First operand: b's storage, column-major (b_cols x b_rows); second: a's (a_cols x a_rows).
  const Layout first(in_t, b_cols, b_rows, b_cols), second(in_t, a_cols, a_rows, a_cols);
  const Layout result(out_t, N, M, N);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublaslt().preference_create(&pref), "cublasLtMatmulPreferenceCreate");
  check(cublaslt().preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &kWorkspaceBytes, sizeof(kWorkspaceBytes)),
        "matmul workspace preference");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check(cublaslt().algo_get_heuristic(handle(), desc, first.d, second.d, result.d, result.d, pref,
                                      1, &heuristic, &found),
        "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) cuda_fail("matmul", "cuBLASLt found no algorithm for this shape");
  void* ws = workspace(kWorkspaceBytes, 3);
  const float alpha32 = 1.0f, beta32 = beta;
  const double alpha64 = 1.0, beta64 = beta;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* betap = f64 ? static_cast<const void*>(&beta64) : &beta32;
  const cublasStatus_t s = cublaslt().matmul(handle(), desc, alpha, b.raw(), first.d, a.raw(),
                                             second.d, betap, out.raw(), result.d, out.raw(),
                                             result.d, &heuristic.algo, ws, kWorkspaceBytes, 0);
  cublaslt().preference_destroy(pref);
  cublaslt().desc_destroy(desc);
  check(s, "cublasLtMatmul");
}

}  // namespace megatron::cuda
