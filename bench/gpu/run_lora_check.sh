#!/usr/bin/env bash
# Issue 40 on the GPU in one device call: LoRA's correctness first, then as many of
# bench/gpu/run_lora.sh's speed arms as the call has time for.
#   1. test_cuda_ops: the op table's LoRA (lora_up) and frozen-weight (*_frozen) cases against
#      their CPU twins
#   2. test_lora: the golden LoRA cases trained on the GPU (bf16, and an FP8 frozen base)
#      against transformers + PEFT's fp32 run
#   3. test_golden *GpuBf16*: full fine-tuning on the GPU still converges with transformers (the
#      engine and the stores changed for LoRA)
#   4. run_lora.sh with ARMS (default "lora8 peft8 full8"), its deadline what is left of 570 s
# Results: $OUT/logs.tgz holding each test's log and lora/ (run_lora.sh's files).
#   tar xzf .devpack/devbin.tgz && bash bench/gpu/run_lora_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu/device_env.sh
out=${OUT:-/tmp/out}; mkdir -p "$out"
run_gtest test_cuda_ops 90 '*lora*:*frozen*'
run_gtest test_lora 120 '*Gpu*'
run_gtest test_golden 150 '*GpuBf16*'
OUT=$out/lora SKIP_PACK=1 DEADLINE=$((570 - SECONDS)) ARMS=${ARMS:-lora8 peft8 full8} bash bench/gpu/run_lora.sh
pack_logs "$out"
