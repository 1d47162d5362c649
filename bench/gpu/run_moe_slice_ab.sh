#!/usr/bin/env bash
# The Qwen3-30B-A3B slice, loom against the compiled PyTorch baseline in one device call, in
# both orders (bench/gpu/run_moe.sh's arms: loom then flash, flash then loom), the baseline
# also with fp32 parameters and AdamW state (PRECISION=amp: loom's 16 bytes a parameter),
# and an op profile of loom's step 2 (LOOM_OP_PROFILE=1). Before them, the GPU golden runs of
# the tiny MoE cases against transformers' fp32 (test_golden). LAYERS: 8 on an H200, 4 on an
# H100; PROFILE=0 leaves the profile out (MODE default, WARMUP 2, STEPS 4, ARM_TIMEOUT 150 unless set). Results under $OUT: golden.log, ab/, ba/, amp/, prof/ (each run_moe.sh's files).
#   tar xzf .devpack/devbin.tgz && LAYERS=8 bash bench/gpu/run_moe_slice_ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
export SKIP_PACK=1 LAYERS=${LAYERS:-8} MODE=${MODE:-default} WARMUP=${WARMUP:-2} STEPS=${STEPS:-4} ARM_TIMEOUT=${ARM_TIMEOUT:-150}
(cd tests && timeout 150 ../.devbin/test_golden --gtest_filter='*Gpu*/4:*Gpu*/5:*Gpu*/6' > "$out/golden.log" 2>&1
 echo "golden rc=$?"; grep -E "^\[ +(OK|FAILED|PASSED)|correlation|Failure" "$out/golden.log" | head -14)
OUT=$out/ab ARMS="loom flash" bash bench/gpu/run_moe.sh 2>&1 | grep -v "^{" | tail -6
OUT=$out/ba ARMS="flash loom" bash bench/gpu/run_moe.sh 2>&1 | grep -v "^{" | tail -6
OUT=$out/amp PRECISION=amp ARMS=flash bash bench/gpu/run_moe.sh 2>&1 | grep -v "^{" | tail -3
[ "${PROFILE:-1}" = 1 ] || exit 0
LOOM_OP_PROFILE=1 WARMUP=1 STEPS=2 OUT=$out/prof ARMS=loom bash bench/gpu/run_moe.sh > /dev/null 2>&1
echo "profile: $(wc -l < "$out/prof/loom-moe.log") lines"
