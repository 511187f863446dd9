#!/usr/bin/env bash
# The CUDA device's checks on a machine with an NVIDIA GPU, in one run of a few minutes:
#   1. the CUDA device's unit tests and the op harness (every op on the GPU against the fp64
#      reference), the GPT model on the GPU against the CPU;
#   2. the kernels' speed (bench_cuda: cuBLASLt GEMMs, attention, memory-bound ops);
#   3. 50 training steps of GPT-2 124M on the CPU and on the GPU from the same initialisation and
#      data, in bf16 and in f32: the loss curves compared step by step;
#   4. throughput and model-FLOPs utilisation of GPT-2 124M and 350M in bf16 (b8, s1024), and
#      the 350M step's time by op category.
# Usage: scripts/gpu_check.sh [BUILD_DIR [DATA_PREFIX [OUT_DIR]]]
#   BUILD_DIR   a build with the CUDA device (default build/; `bash scripts/build.sh` makes it
#               where a CUDA toolkit is installed)
#   DATA_PREFIX an indexed dataset of GPT-2 tokens (default data/brown_text_document, from
#               scripts/fetch_data.sh)
#   OUT_DIR     where the logs go (default gpu_check/); CPU loss curves already there
#               (curve_cpu_bf16.log, curve_cpu_f32.log from the same train_gpt_device command with
#               --device cpu) are reused, to spend the GPU machine's time on the GPU
# Exit status: 0 when every check passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
DATA="${2:-data/brown_text_document}"
OUT="${3:-gpu_check}"
mkdir -p "$OUT"
status=0
fail() { echo "FAILED: $*"; status=1; }
bin() { find "$BUILD" -type f -name "$1" -perm -u+x | head -1; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || fail "nvidia-smi"

# 1. Correctness.
check_tests() {  # NAME [ARGS...]: a GoogleTest binary, every test run and passed (none skipped)
  local exe log
  exe=$(bin "$1")
  [[ -n "$exe" ]] || { fail "no $1 in $BUILD"; return; }
  log="$OUT/$1.log"
  timeout 300 "$exe" "${@:2}" >"$log" 2>&1
  if grep -q "^\[  PASSED  \]" "$log" && ! grep -q "FAILED\|SKIPPED" "$log"; then
    echo "ok: $1 ($(grep -c '^\[       OK \]' "$log") tests)"
  else
    fail "$1: see $log"
    grep -E "Failure|FAILED|SKIPPED" -A3 "$log" | head -20
  fi
}
check_tests test_cuda_device --gtest_filter=-*WithoutAGpu*
check_tests test_op_harness --gtest_filter=-*CoversEveryOp*
check_tests test_gpt_model --gtest_filter=GPTModelDevices.*

# 2. Kernel speed.
timeout 120 "$(bin bench_cuda)" >"$OUT/bench_cuda.log" 2>&1 || fail "bench_cuda"
cat "$OUT/bench_cuda.log"

# 3. Loss curves, CPU against GPU.
train=$(bin train_gpt_device)
for dt in bf16 f32; do
  for dev in cpu cuda; do
    # The CPU curve needs no GPU: one computed beforehand (any machine, same command) is reused.
    if [[ $dev == cpu ]] && [[ $(grep -c "^step .* loss" "$OUT/curve_cpu_$dt.log" 2>/dev/null) == 50 ]]; then
      echo "reusing $OUT/curve_cpu_$dt.log"
      continue
    fi
    timeout 900 "$train" --device $dev --dtype $dt --model gpt2-124m --data "$DATA" \
      --micro-batch-size 4 --seq-length 256 --steps 50 >"$OUT/curve_${dev}_$dt.log" 2>&1 ||
      fail "curve $dev $dt"
  done
  # bf16: both devices round GEMM inputs to bf16 and accumulate in f32; they differ in summation
  # order only, which 50 steps of training amplify: 1% is the bf16-vs-f32 tolerance of the CPU's
  # mixed-precision test, a bound for what is left. f32: 0.2%.
  tol=$([[ $dt == bf16 ]] && echo 0.01 || echo 0.002)
  /usr/bin/env python3 - "$OUT/curve_cpu_$dt.log" "$OUT/curve_cuda_$dt.log" "$tol" "$dt" <<'PY' || status=1
import re, sys
def losses(path):
    return [float(m.group(1)) for m in re.finditer(r"^step +\d+  loss ([0-9.]+)", open(path).read(), re.M)]
cpu, gpu, tol, dt = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if len(cpu) != 50 or len(gpu) != 50:
    print(f"FAILED: curve {dt}: {len(cpu)} CPU and {len(gpu)} GPU steps"); sys.exit(1)
worst = max(abs(g - c) / c for c, g in zip(cpu, gpu))
print(f"{'ok' if worst <= tol else 'FAILED'}: {dt} loss curve, GPU vs CPU over 50 steps: "
      f"largest relative difference {worst:.2e} (tolerance {tol}); step 50: CPU {cpu[-1]:.4f}, "
      f"GPU {gpu[-1]:.4f}")
sys.exit(0 if worst <= tol else 1)
PY
done

# 4. Throughput.
for model in gpt2-124m gpt2-350m; do
  timeout 300 "$train" --device cuda --dtype bf16 --model $model --data "$DATA" \
    --micro-batch-size 8 --seq-length 1024 --steps 12 >"$OUT/speed_$model.log" 2>&1 ||
    fail "speed $model"
  head -1 "$OUT/speed_$model.log"
  grep summary "$OUT/speed_$model.log"
done
# Where the 350M step's time goes, by op category (each op waits for the GPU: slower steps).
timeout 300 "$train" --device cuda --dtype bf16 --model gpt2-350m --data "$DATA" \
  --micro-batch-size 8 --seq-length 1024 --steps 6 --profile >"$OUT/profile_gpt2-350m.log" 2>&1 ||
  fail "profile gpt2-350m"
grep profile "$OUT/profile_gpt2-350m.log"
exit $status
