#!/usr/bin/env bash
# One device call for the CUDA code written while no device was lent (2026-12-07, compiled,
# never run): each binary's new GPU cases first, cheapest first, then the older GPU cases they
# sit beside. Any H100 or H200 will do. Per binary: its exit code, passed / failed counts and
# the failures' first lines; logs in $OUT/logs.tgz.
#   1. test_cuda_ops: the op table's CUDA cases against their CPU twins for LoRA (lora_up at
#      ranks 8, 4, 2; frozen weights; lora_dropout), context attention (CP2 / CP4 shares,
#      isolated samples across chunks, head_dim 128 and 64) and the THD attention
#   2. test_lora: the golden LoRA cases in bf16, over an FP8 base and with dropout
#   3. test_isolated: the GPU golden runs of isolated rows (the THD backward now in groups)
#   4. test_recompute: recompute and layout.activation_offload on the CUDA engine, bit for bit
#   5. test_parallel_cuda_train: CP on GPU ranks sharing the GPU, then EP (MoeCudaTrainTest),
#      then the dense layouts (engine changes since their last run)
#   6. test_golden: the GPU bf16 golden runs (dense and MoE)
#   tar xzf .devpack/devbin.tgz && bash bench/gpu/run_pending_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
run_gtest test_cuda_ops 90 '*lora*:*frozen*:*dropout*:*context*:*Context*:*Thd*:*attention*'
run_gtest test_lora 120 '*Gpu*'
run_gtest test_isolated 90 '*Gpu*'
run_gtest test_recompute 90 '*cuda*'
run_gtest test_parallel_cuda_train 240 '*ContextParallel*:MoeCudaTrainTest.*:*EveryLayout*'
run_gtest test_golden 60 '*GpuBf16*'
pack_logs "$out"
