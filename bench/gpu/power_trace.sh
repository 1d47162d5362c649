#!/usr/bin/env bash
# Runs a command while nvidia-smi samples the SM clock, the board power and the active
# throttle reasons every 200 ms into $TRACE (CSV), to show whether a run is power-capped.
#   TRACE=/tmp/out/loom-4b-power.csv bash bench/gpu/power_trace.sh .devbin/loom train ...
set -uo pipefail
trace=${TRACE:?TRACE: the CSV to write}
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 200 > "$trace" &
sampler=$!
"$@"
rc=$?
kill "$sampler"
exit $rc
