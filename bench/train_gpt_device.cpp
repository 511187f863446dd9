// A GPT trained on one device, as the trainer's step does it (forward, backward, global gradient
// clipping, AdamW, the compute copy refreshed), without the trainer around it: the same run on
// the CPU device and on the CUDA device gives the two loss curves side by side, and on a GPU the
// throughput of GPT-2-sized models with the model-FLOPs utilisation against the GEMM peak measured
// in the same process. Data: the token stream of a Megatron indexed dataset (.bin/.idx, uint16 or
// int32 tokens), read in consecutive windows of seq + 1 tokens.
//
//   build/bench/train_gpt_device --device cuda --dtype bf16 --model gpt2-124m
//       --data data/brown_text_document --micro-batch-size 8 --seq-length 1024 --steps 30
//
// Prints one line per step (loss, grad norm, ms, tokens/s) and a summary line.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "models/gpt/gpt_flops.h"
#include "models/gpt/gpt_model.h"
#include "optim/adamw.h"
#include "tensor/op_profile.h"
#include "tensor/ops.h"

namespace megatron {
namespace {

struct Options {
  std::string device = "cpu", dtype = "f32", model = "tiny", data;
  int64_t micro_batch_size = 4, seq_length = 256, steps = 50, warmup = 3;
  double lr = 3e-4, clip_grad = 1.0;
  uint64_t seed = 1234;
  bool profile = false;  // time the ops by category (each op waits for the device: slower steps)
};

TransformerConfig model_config(const Options& o) {
  TransformerConfig c;
  // GPT-2's shapes (Megatron's examples): 124M = 12 x 768, 350M = 24 x 1024; tiny for curves on a
  // laptop CPU.
  if (o.model == "gpt2-124m") {
    c.num_layers = 12, c.hidden_size = 768, c.num_attention_heads = 12;
  } else if (o.model == "gpt2-350m") {
    c.num_layers = 24, c.hidden_size = 1024, c.num_attention_heads = 16;
  } else if (o.model == "tiny") {
    c.num_layers = 4, c.hidden_size = 256, c.num_attention_heads = 4;
  } else {
    throw InvalidArgument("--model must be tiny, gpt2-124m or gpt2-350m, got '" + o.model + "'");
  }
  c.seq_length = o.seq_length;
  c.max_position_embeddings = std::max<int64_t>(1024, o.seq_length);
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.init_method_std = 0.02;
  c.compute_dtype = o.dtype == "bf16" ? DType::kBF16 : DType::kF32;
  c.finalize();
  return c;
}

// The token stream of an indexed dataset's .bin (dtype from the .idx header: code 8 uint16, 4
// int32), as i64.
std::vector<int64_t> read_tokens(const std::string& prefix) {
  std::ifstream idx(prefix + ".idx", std::ios::binary), bin(prefix + ".bin", std::ios::binary);
  if (!idx || !bin) throw InvalidArgument("--data: cannot open " + prefix + ".idx/.bin");
  char header[18];
  idx.read(header, sizeof(header));
  if (!idx || std::string(header, 9) != std::string("MMIDIDX\0\0", 9)) {
    throw InvalidArgument("--data: " + prefix + ".idx is not a Megatron indexed dataset");
  }
  const int code = header[17];
  std::vector<char> bytes((std::istreambuf_iterator<char>(bin)), std::istreambuf_iterator<char>());
  std::vector<int64_t> tokens;
  if (code == 8) {
    for (size_t i = 0; i + 1 < bytes.size(); i += 2) {
      uint16_t t;
      std::memcpy(&t, &bytes[i], 2);
      tokens.push_back(t);
    }
  } else if (code == 4) {
    for (size_t i = 0; i + 3 < bytes.size(); i += 4) {
      int32_t t;
      std::memcpy(&t, &bytes[i], 4);
      tokens.push_back(t);
    }
  } else {
    throw InvalidArgument("--data: token dtype code " + std::to_string(code) +
                          " (expected 8, uint16, or 4, int32)");
  }
  return tokens;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int run(const Options& o) {
  const Device device = o.device == "cuda" ? Device::kCUDA : Device::kCPU;
  std::string why;
  if (!device_available(device, &why)) throw InvalidArgument("--device " + o.device + ": " + why);
  const TransformerConfig cfg = model_config(o);
  const std::vector<int64_t> stream = read_tokens(o.data);
  const int64_t b = o.micro_batch_size, s = o.seq_length;
  GPTModel model(cfg);
  ParamSet params(model.parameters(), cfg.compute_dtype, device);
  params.initialize(o.seed);
  AdamWConfig acfg;
  acfg.weight_decay = 0.1;
  acfg.beta2 = 0.95;
  AdamW opt(params, acfg);
  int64_t nparams = 0;
  for (const Param* p : params.params()) nparams += p->shape.numel();
  // The GEMM peak of this device and dtype, in this process: the best of two square sizes. (The
  // trainer's train/gemm_peak.h does the same, but its library links MPI, and this program is
  // meant to run on GPU machines that have only the CUDA runtime.)
  double peak = 0;
  for (int64_t n : device == Device::kCUDA ? std::vector<int64_t>{4096, 8192}
                                           : std::vector<int64_t>{512, 1024}) {
    Tensor a = Tensor::full({n, n}, 0.5, cfg.compute_dtype, device);
    Tensor c = Tensor::zeros({n, n}, DType::kF32, device);
    ops::matmul(c, a, false, a, true);
    device_synchronize(device);
    for (int r = 0; r < 5; ++r) {
      const double t0 = now();
      ops::matmul(c, a, false, a, true);
      device_synchronize(device);
      peak = std::max(peak, 2.0 * n * n * n / (now() - t0));
    }
  }
  std::printf(
      "device %s (%s), %s, %s: %.1fM parameters, %ld tokens of data, GEMM peak %.1f "
      "TFLOP/s\n",
      o.device.c_str(), device_description(device).c_str(), o.model.c_str(),
      dtype_name(cfg.compute_dtype), nparams / 1e6, static_cast<long>(stream.size()), peak / 1e12);
  // Model FLOPs per token by Megatron's formula, the trainer's MFU numerator.
  const double fpt = model_flops_per_iteration(cfg, b) / static_cast<double>(b * s);
  double timed = 0;
  int64_t timed_tokens = 0;
  int64_t at = 0;
  for (int64_t step = 1; step <= o.steps; ++step) {
    Tensor tokens = Tensor::empty({b, s}, DType::kI64), labels = Tensor::empty({b, s}, DType::kI64);
    for (int64_t i = 0; i < b; ++i) {
      if (at + s + 1 > static_cast<int64_t>(stream.size())) at = 0;
      for (int64_t t = 0; t < s; ++t) {
        tokens.data<int64_t>()[i * s + t] = stream[at + t];
        labels.data<int64_t>()[i * s + t] = stream[at + t + 1];
      }
      at += s;
    }
    device_synchronize(device);
    if (o.profile && step == o.warmup + 1) set_op_profiling(true);
    const double t0 = now();
    GPTModel::Ctx ctx;
    const ForwardMode mode{true, o.seed, static_cast<uint64_t>(step)};
    Tensor loss = model.forward(tokens.to(device), labels.to(device), Tensor(), ctx, mode);
    const Tensor ones = Tensor::full(loss.shape(), 1.0, DType::kF32, device);
    const double mean = ops::masked_sum(loss, ones).sum / static_cast<double>(loss.numel());
    Tensor dloss =
        Tensor::full(loss.shape(), 1.0 / static_cast<double>(loss.numel()), loss.dtype(), device);
    params.zero_grads();
    model.backward(dloss, ctx);
    const double norm = grad_norm(params);
    const double clip = o.clip_grad > 0 && norm > o.clip_grad ? o.clip_grad / (norm + 1e-6) : 1.0;
    const double lr = o.lr * std::min(1.0, static_cast<double>(step) / 10.0);  // 10 warm-up steps
    opt.step(StepRates{lr, lr, acfg.weight_decay}, clip);
    device_synchronize(device);
    const double dt = now() - t0;
    if (step > o.warmup) {
      timed += dt;
      timed_tokens += b * s;
    }
    std::printf("step %3ld  loss %.6f  grad norm %.4f  %8.1f ms  %9.0f tokens/s\n",
                static_cast<long>(step), mean, norm, dt * 1e3, b * s / dt);
    std::fflush(stdout);
  }
  if (timed > 0) {
    const double tps = static_cast<double>(timed_tokens) / timed;
    std::printf(
        "summary: %s %s %s b%ld s%ld: %.0f tokens/s, %.1f TFLOP/s of model FLOPs, MFU %.1f%% "
        "of the measured %s GEMM peak\n",
        o.device.c_str(), o.model.c_str(), dtype_name(cfg.compute_dtype), static_cast<long>(b),
        static_cast<long>(s), tps, tps * fpt / 1e12, 100.0 * tps * fpt / peak,
        dtype_name(cfg.compute_dtype));
    if (o.profile) {
      const double steps = static_cast<double>(o.steps - o.warmup);
      double in_ops = 0;
      std::printf("profile, ms per step (%.1f in all):", timed * 1e3 / steps);
      for (int c = 0; c < kOpCategories; ++c) {
        const double sec = op_seconds(static_cast<OpCategory>(c));
        in_ops += sec;
        std::printf(" %s %.1f,", op_category_name(static_cast<OpCategory>(c)), sec * 1e3 / steps);
      }
      std::printf(" outside ops %.1f\n", (timed - in_ops) * 1e3 / steps);
      std::printf("profile by op, ms per step:");
      for (const auto& [op, sec] : op_seconds_by_op()) {
        if (sec * 1e3 / steps >= 0.1) std::printf(" %s %.1f,", op.c_str(), sec * 1e3 / steps);
      }
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::Options o;
  CLI::App app("GPT training steps on one device (CPU or CUDA), for loss curves and throughput");
  app.add_option("--device", o.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", o.dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--model", o.model, "tiny, gpt2-124m or gpt2-350m");
  app.add_option("--data", o.data, "indexed dataset prefix (PATH.bin, PATH.idx)")->required();
  app.add_option("--micro-batch-size", o.micro_batch_size, "sequences per step");
  app.add_option("--seq-length", o.seq_length, "tokens per sequence");
  app.add_option("--steps", o.steps, "optimizer steps");
  app.add_option("--lr", o.lr, "peak learning rate (10 warm-up steps)");
  app.add_option("--seed", o.seed, "initialisation seed");
  app.add_flag("--profile", o.profile,
               "print the time per step in each op category (GEMM, attention, ...; each op then "
               "waits for the device, so steps run slower)");
  CLI11_PARSE(app, argc, argv);
  try {
    return megatron::run(o);
  } catch (const megatron::InvalidArgument& e) {
    std::fprintf(stderr, "train_gpt_device: %s\n", e.what());
    return 2;
  }
}
