#include "tensor/cuda/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace megatron::cuda {
namespace {

const std::string kLibrary = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);

void* open_library() {
  // RTLD_NODELETE: the handles and function pointers live until the process ends.
  constexpr int kFlags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
  if (void* h = dlopen(kLibrary.c_str(), kFlags)) return h;
  std::string errors = dlerror();
#ifdef MEGATRON_CUDA_LIBRARY_DIR
  const std::string configured = std::string(MEGATRON_CUDA_LIBRARY_DIR) + "/" + kLibrary;
  if (void* h = dlopen(configured.c_str(), kFlags)) return h;
  errors += std::string("; ") + dlerror();
#endif
  MEGATRON_CHECK(false, "cannot open ", kLibrary, " (cuBLASLt, for GEMMs on the GPU): ", errors,
                 "; install the CUDA toolkit's cuBLAS or add its library folder to "
                 "LD_LIBRARY_PATH");
  return nullptr;
}

template <typename Fn>
void resolve(void* library, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  MEGATRON_CHECK(fn != nullptr, kLibrary, " has no ", name,
                 ": it is older than the cuBLAS headers this binary was built with; install a "
                 "matching CUDA toolkit or rebuild");
}

CublasLt load() {
  void* lib = open_library();
  CublasLt f{};
  resolve(lib, f.create, "cublasLtCreate");
  resolve(lib, f.layout_create, "cublasLtMatrixLayoutCreate");
  resolve(lib, f.layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(lib, f.desc_create, "cublasLtMatmulDescCreate");
  resolve(lib, f.desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(lib, f.desc_set_attribute, "cublasLtMatmulDescSetAttribute");
  resolve(lib, f.preference_create, "cublasLtMatmulPreferenceCreate");
  resolve(lib, f.preference_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(lib, f.preference_set_attribute, "cublasLtMatmulPreferenceSetAttribute");
  resolve(lib, f.algo_get_heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(lib, f.matmul, "cublasLtMatmul");
  return f;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt f = load();  // thread-safe; a failed load throws and is retried
  return f;
}

}  // namespace megatron::cuda
