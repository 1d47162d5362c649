#!/usr/bin/env bash
# Throughput and memory of `loom data build` on ~1 GB of synthetic conversations.
#
#   bench/data/run_build.sh [BUILD_DIR] [BYTES]      # defaults: build-release, 1e9
#
# BUILD_DIR holds a Release build of the loom target:
#   cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release && cmake --build build-release --target loom
# Generates the input with make_conversations.py (seed 1), runs the build under
# /usr/bin/time -v with every core, and writes bench/results/<date>-data-build.json: input
# MB/s over the whole command (both passes, tokenizer load included), peak RSS, and the
# manifest's counts. Scratch files go to $TMPDIR (default /tmp); ~4x BYTES of free disk.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build-release}"
bytes="${2:-1e9}"
loom="$build/src/cli/loom"
[ -x "$loom" ] || { echo "run_build.sh: $loom is missing: build the loom target of a Release build" >&2; exit 2; }
work="$(mktemp -d "${TMPDIR:-/tmp}/loom-bench-data.XXXXXX")"
trap 'rm -rf "$work"' EXIT

python3 "$root/bench/data/make_conversations.py" --bytes "$bytes" --seed 1 --out "$work/conv.jsonl"
sync
load_before="$(cut -d' ' -f1 /proc/loadavg)"
/usr/bin/time -v -o "$work/time.txt" "$loom" data build --input "$work/conv.jsonl" \
  --tokenizer "$root/tests/data/qwen3-tokenizer" --row-tokens 8192 --seed 1234 --loss-mask qwen3 \
  --out "$work/rows" 2> "$work/stderr.txt" || { cat "$work/stderr.txt" "$work/time.txt" >&2; exit 1; }
load_after="$(cut -d' ' -f1 /proc/loadavg)"
tail -n 3 "$work/stderr.txt"

python3 - "$work" "$root" "$load_before" "$load_after" "$("$loom" --version)" <<'PY'
import datetime, json, os, re, sys
work, root, load_before, load_after, version = sys.argv[1:]
time_txt = open(os.path.join(work, "time.txt")).read()
def field(name):
    return re.search(re.escape(name) + r": (.*)", time_txt).group(1).strip()
def seconds(clock):
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
m = json.load(open(os.path.join(work, "rows", "manifest.json")))
wall = seconds(field("Elapsed (wall clock) time (h:mm:ss or m:ss)"))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
record = {
    "benchmark": "loom data build, ~1 GB synthetic conversations (bench/data/make_conversations.py --seed 1)",
    "date": datetime.date.today().isoformat(),
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
    "command": "bench/data/run_build.sh",
    "loom": version.removeprefix("loom "),
    "loom_args": "--row-tokens 8192 --seed 1234 --loss-mask qwen3 (every core)",
    "input_bytes": m["input_bytes"], "input_lines": m["input_lines"], "conversations": m["conversations"],
    "skipped_conversations": m["skipped_conversations"], "conversation_tokens": m["conversation_tokens"],
    "rows": m["rows"], "row_tokens": m["row_tokens"], "rows_without_target": m["rows_without_target"],
    "supervised_token_ratio": m["supervised_token_ratio"], "rows_sha256": m["rows_sha256"],
    "wall_s": wall,
    "input_MB_per_s": m["input_bytes"] / wall / 1e6,
    "tokens_per_s": m["conversation_tokens"] / wall,
    "user_s": float(field("User time (seconds)")), "system_s": float(field("System time (seconds)")),
    "cpu_percent": field("Percent of CPU this job got"),
    "peak_rss_MiB": int(field("Maximum resident set size (kbytes)")) / 1024,
    "load_average_1m": {"before": float(load_before), "after": float(load_after)},
}
# Throughput per CPU-second: what the code does with the cores it got (a shared machine
# gives it fewer than it asks for; wall-clock MB/s is then lower than cores × this).
record["input_MB_per_cpu_s"] = m["input_bytes"] / (record["user_s"] + record["system_s"]) / 1e6
out = os.path.join(root, "bench", "results", f"{record['date']}-data-build.json")
with open(out + ".tmp", "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
os.replace(out + ".tmp", out)
print(json.dumps(record, indent=2))
print("->", out)
PY
