// A driver of comm/compressed_allreduce.h for tests/comm/test_compressed_allreduce.py, run as
// every rank of an mpiexec job: rank r reads DIR/in_<r>.f32 (ROUNDS x N little-endian f32, one
// momentum per round), runs ROUNDS compressed all-reduces over the world with one set of error
// buffers (the error feedback carried from round to round, as 1-bit Adam does step to step), and
// writes DIR/out_<r>.f32 (every round's result), DIR/worker_error_<r>.f32 and
// DIR/server_error_<r>.f32 (the errors after the last round). Not a test by itself: the Python
// script compares the files with its NumPy restatement of DeepSpeed's algorithm.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "comm/compressed_allreduce.h"
#include "comm/mpi_runtime.h"

namespace {

std::vector<float> read_floats(const std::string& path, size_t count) {
  std::vector<float> v(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in)
    throw std::runtime_error("cannot read " + std::to_string(count) + " floats from " + path);
  return v;
}

void write_floats(const std::string& path, const float* p, size_t count) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(count * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  megatron::MpiRuntime runtime(&argc, &argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: compressed_allreduce_tool DIR N ROUNDS\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t n = std::atoll(argv[2]), rounds = std::atoll(argv[3]);
  megatron::ProcessGroup& world = *runtime.world();
  const std::string r = std::to_string(world.rank());
  try {
    std::vector<float> all =
        read_floats(dir + "/in_" + r + ".f32", static_cast<size_t>(n * rounds));
    megatron::CompressionErrors errors = megatron::CompressionErrors::zeros(n, world.size());
    for (int64_t t = 0; t < rounds; ++t)
      megatron::compressed_allreduce(all.data() + t * n, n, errors, world);
    write_floats(dir + "/out_" + r + ".f32", all.data(), all.size());
    write_floats(dir + "/worker_error_" + r + ".f32", errors.worker.data<float>(),
                 static_cast<size_t>(errors.worker.numel()));
    write_floats(dir + "/server_error_" + r + ".f32", errors.server.data<float>(),
                 static_cast<size_t>(errors.server.numel()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %s: %s\n", r.c_str(), e.what());
    return 1;
  }
  return 0;
}
