// cuBLASLt, opened on the first GEMM on a GPU rather than linked. Linking it costs every process
// about 0.3 s of start-up (its initialisers run over a half-gigabyte library) whether or not it
// ever touches a GPU: every rank of a CPU run and every test process paid it.
#pragma once

#include <cublasLt.h>

namespace megatron::cuda {

// The entry points gemm.cpp calls, resolved from the library.
struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&cublasLtMatmul) matmul;
};

// Opens libcublasLt.so.<the major version compiled against> on the first call (the library
// search path first, then the toolkit's library folder found at configure time). Throws
// InvalidArgument naming the library and the fix when it cannot be opened or lacks a symbol.
const CublasLt& cublaslt();

}  // namespace megatron::cuda
