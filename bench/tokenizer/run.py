#!/usr/bin/env python3
"""Tokenizer encoding speed, loom vs Hugging Face `tokenizers`, one thread each.

    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release
    cmake --build build-release --target loom_data
    /opt/tokvenv/bin/python bench/tokenizer/run.py --build build-release

Compiles bench_tokenizer.cpp against the build's libloom_data.a (so it needs no CMake
target of its own), makes three document sets from files every Debian machine has, runs
both tokenizers on each (best of --repeats, on one thread: RAYON_NUM_THREADS=1 for HF),
checks that both produced the same ids, and writes bench/results/<date>-tokenizer.json.

Document sets (their sha256 goes into the result, as they depend on the machine's files):
  english       the license texts of /usr/share/common-licenses, one document each;
  code          the running Python's standard library modules (*.py), one document each;
  multilingual  the valid strings of tests/data/tokenizer_corpus.jsonl.gz (every script,
                emoji, marks, white space, code, added tokens), 64 to a document.
"""
import argparse
import datetime
import glob
import gzip
import hashlib
import json
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_texts(paths):
    docs = []
    for p in sorted(paths):
        try:
            with open(p, encoding="utf-8") as f:
                docs.append(f.read())
        except (UnicodeDecodeError, IsADirectoryError):
            continue
    return docs


def document_sets():
    english = read_texts(glob.glob("/usr/share/common-licenses/*"))
    code = read_texts(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    lines = gzip.open(os.path.join(ROOT, "tests/data/tokenizer_corpus.jsonl.gz"), "rt", encoding="utf-8").read().split("\n")[1:-1]
    strings = [json.loads(line)["text"] for line in lines if '"text"' in line[:10]]
    multilingual = ["\n".join(strings[i:i + 64]) for i in range(0, len(strings), 64)]
    return {"english": english, "code": code, "multilingual": multilingual}


def fnv1a(ids_lists):
    h = 1469598103934665603
    for ids in ids_lists:
        for i in ids:
            h = ((h ^ i) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return str(h)


def bench_hf(tok, docs, repeats):
    best, first = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        encodings = [tok.encode(d).ids for d in docs]
        best = min(best, time.perf_counter() - start)
        first = first or best
    best_batch = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tok.encode_batch_fast(docs)
        best_batch = min(best_batch, time.perf_counter() - start)
    return best, first, best_batch, sum(len(e) for e in encodings), fnv1a(encodings)


def build_bench(build):
    exe = os.path.join(build, "bench_tokenizer")
    libs = [os.path.join(build, "src/data/libloom_data.a"), os.path.join(build, "src/core/libloom_core.a")]
    for lib in libs:
        if not os.path.exists(lib):
            sys.exit(f"{lib} is missing: build the loom_data target of a Release build first")
    cmd = [os.environ.get("CXX", "c++"), "-O2", "-std=c++20", "-I", os.path.join(ROOT, "src"),
           os.path.join(ROOT, "bench/tokenizer/bench_tokenizer.cpp"), *libs, "-lpthread", "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default=os.path.join(ROOT, "build-release"), help="a Release build dir")
    parser.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/data/qwen3-tokenizer"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default bench/results/<date>-tokenizer.json")
    args = parser.parse_args()
    exe = build_bench(args.build)
    tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    with open(os.path.join(args.tokenizer, "tokenizer.json"), "rb") as f:
        tokenizer_sha = hashlib.sha256(f.read()).hexdigest()

    results = []
    for name, docs in document_sets().items():
        blob = "\n".join(json.dumps({"text": d}, ensure_ascii=False) for d in docs) + "\n"
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
            f.write(blob)
            path = f.name
        try:
            out = subprocess.run([exe, args.tokenizer, path, str(args.repeats)], check=True,
                                 capture_output=True, text=True).stdout
        finally:
            os.unlink(path)
        loom = json.loads(out)
        hf_s, hf_first_s, hf_batch_s, hf_tokens, hf_hash = bench_hf(tok, docs, args.repeats)
        nbytes = loom["bytes"]
        hf_best = min(hf_s, hf_batch_s)
        results.append({
            "name": name, "documents": len(docs), "bytes": nbytes, "tokens": loom["tokens"],
            "sha256": hashlib.sha256(blob.encode()).hexdigest(),
            "ids_equal": loom["tokens"] == hf_tokens and loom["ids_fnv1a"] == hf_hash,
            "loom": {"seconds": loom["seconds"], "MB_per_s": nbytes / loom["seconds"] / 1e6,
                     "tokens_per_s": loom["tokens"] / loom["seconds"],
                     "first_repeat_MB_per_s": nbytes / loom["first_seconds"] / 1e6},
            "hf_encode": {"seconds": hf_s, "MB_per_s": nbytes / hf_s / 1e6, "tokens_per_s": hf_tokens / hf_s,
                          "first_repeat_MB_per_s": nbytes / hf_first_s / 1e6},
            "hf_encode_batch_fast": {"seconds": hf_batch_s, "MB_per_s": nbytes / hf_batch_s / 1e6,
                                     "tokens_per_s": hf_tokens / hf_batch_s},
            "speedup_vs_best_hf": hf_best / loom["seconds"],
        })
        print(f"{name:13s} {nbytes / 1e6:6.2f} MB  loom {nbytes / loom['seconds'] / 1e6:6.2f} MB/s  "
              f"HF {nbytes / hf_best / 1e6:6.2f} MB/s  x{hf_best / loom['seconds']:.2f}  "
              f"ids {'equal' if results[-1]['ids_equal'] else 'DIFFER'}")

    date = datetime.date.today().isoformat()
    record = {
        "benchmark": "tokenizer encode, one thread", "date": date,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
        "tokenizer_json_sha256": tokenizer_sha, "oracle": f"tokenizers {tokenizers.__version__}",
        "repeats": args.repeats, "command": "bench/tokenizer/run.py", "datasets": results,
    }
    out = args.out or os.path.join(ROOT, "bench/results", f"{date}-tokenizer.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(out + ".tmp", out)
    print("->", out)
    if not all(r["ids_equal"] for r in results):
        sys.exit("loom and HF ids differ")


if __name__ == "__main__":
    main()
