// cuBLASLt is opened on first use, not linked: a process that never runs a GPU GEMM does not pay
// its start-up (about 0.3 s per process). Runs without a GPU: opening the library and resolving
// its symbols needs no device.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "tensor/cuda/cublaslt.h"

namespace megatron::cuda {
namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(library) != std::string::npos;
}

TEST(CublasLt, OpensOnFirstUseWithEveryEntryPoint) {
  // This binary has this one test, so nothing before it can have opened the library.
  EXPECT_FALSE(mapped("libcublasLt.so")) << "cuBLASLt was loaded at start-up: is it linked?";
  const CublasLt& f = cublaslt();
  EXPECT_TRUE(mapped("libcublasLt.so"));
  for (const void* fn :
       {reinterpret_cast<const void*>(f.create), reinterpret_cast<const void*>(f.layout_create),
        reinterpret_cast<const void*>(f.layout_destroy),
        reinterpret_cast<const void*>(f.desc_create), reinterpret_cast<const void*>(f.desc_destroy),
        reinterpret_cast<const void*>(f.desc_set_attribute),
        reinterpret_cast<const void*>(f.preference_create),
        reinterpret_cast<const void*>(f.preference_destroy),
        reinterpret_cast<const void*>(f.preference_set_attribute),
        reinterpret_cast<const void*>(f.algo_get_heuristic),
        reinterpret_cast<const void*>(f.matmul)})
    EXPECT_NE(fn, nullptr);
  EXPECT_EQ(&cublaslt(), &f);  // opened once
}

}  // namespace
}  // namespace megatron::cuda
