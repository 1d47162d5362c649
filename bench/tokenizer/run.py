#!/usr/bin/env python3
"""Tokenizer encoding speed, loom vs Hugging Face `tokenizers`, one thread each.

    cmake -S . -B build-release -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build build-release --target loom_data
    .venv/bin/python bench/tokenizer/run.py --build build-release

Compiles bench_tokenizer.cpp against the build's libloom_data.a (so it needs no CMake
target of its own), makes three document sets from files every Debian machine has, runs
both tokenizers on each on one thread (RAYON_NUM_THREADS=1 for HF), checks that both
produced the same ids, and writes bench/results/<date>-tokenizer.json.

Both sides are timed the same two ways, best of --repeats, each repeat on a freshly
loaded tokenizer (loading is not timed):
  cold  the first pass over the documents, the tokenizer's cache empty (loom caches merged
        splits, HF's BPE caches words: 10,000 of them by default);
  warm  a second pass over the same documents on the same tokenizer.
HF is timed through `Tokenizer.encode` (one call per document), `encode_batch` and
`encode_batch_fast` (one call for all, on its one Rayon thread; the fast one skips offsets);
the speedups compare loom with the fastest of the three.

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


def bench_hf(path, docs, repeats):
    """Best cold and warm seconds of each HF entry point, each repeat on a fresh tokenizer."""
    times = {how: [float("inf"), float("inf")] for how in ("encode", "encode_batch", "encode_batch_fast")}
    encodings = None
    for _ in range(repeats):
        for how in times:
            tok = tokenizers.Tokenizer.from_file(path)
            for p in range(2):  # cold, then warm
                start = time.perf_counter()
                if how == "encode":
                    out = [tok.encode(d).ids for d in docs]
                else:
                    out = [e.ids for e in getattr(tok, how)(docs)]
                times[how][p] = min(times[how][p], time.perf_counter() - start)
                encodings = out
    return times, sum(len(e) for e in encodings), fnv1a(encodings)


def build_bench(build):
    exe = os.path.join(build, "bench_tokenizer")
    libs = [os.path.join(build, "src/data/libloom_data.a"), os.path.join(build, "src/core/libloom_core.a")]
    for lib in libs:
        if not os.path.exists(lib):
            sys.exit(f"{lib} is missing: build the loom_data target of a RelWithDebInfo or Release build first")
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
    parser.add_argument("--build", default=os.path.join(ROOT, "build-release"), help="an optimised build dir")
    parser.add_argument("--tokenizer", default=os.path.join(ROOT, "tests/data/qwen3-tokenizer"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default bench/results/<date>-tokenizer.json")
    args = parser.parse_args()
    exe = build_bench(args.build)
    load_at_start = os.getloadavg()[0]  # the machine may be shared: both sides run under the same load
    tokenizer_json = os.path.join(args.tokenizer, "tokenizer.json")
    with open(tokenizer_json, "rb") as f:
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
        hf, hf_tokens, hf_hash = bench_hf(tokenizer_json, docs, args.repeats)
        nbytes = loom["bytes"]

        def rates(seconds, tokens):
            return {"seconds": seconds, "MB_per_s": nbytes / seconds / 1e6, "tokens_per_s": tokens / seconds}

        entry = {
            "name": name, "documents": len(docs), "bytes": nbytes, "tokens": loom["tokens"],
            "sha256": hashlib.sha256(blob.encode()).hexdigest(),
            "ids_equal": loom["tokens"] == hf_tokens and loom["ids_fnv1a"] == hf_hash,
        }
        best_hf = [min(t[i] for t in hf.values()) for i in range(2)]
        for i, state in enumerate(["cold", "warm"]):
            entry[state] = {"loom": rates(loom[f"{state}_seconds"], loom["tokens"])}
            for how, t in hf.items():
                entry[state][f"hf_{how}"] = rates(t[i], hf_tokens)
            entry[state]["speedup_vs_best_hf"] = best_hf[i] / loom[f"{state}_seconds"]
        results.append(entry)
        print(f"{name:13s} {nbytes / 1e6:6.2f} MB  " + "  ".join(
            f"{state}: loom {entry[state]['loom']['MB_per_s']:6.2f} MB/s, HF {nbytes / best_hf[i] / 1e6:5.2f} MB/s "
            f"(x{entry[state]['speedup_vs_best_hf']:.1f})" for i, state in enumerate(["cold", "warm"]))
            + f"  ids {'equal' if entry['ids_equal'] else 'DIFFER'}")

    date = datetime.date.today().isoformat()
    record = {
        "benchmark": "tokenizer encode, one thread", "date": date,
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1m_at_start": load_at_start},
        "loom": loom["loom"],
        "tokenizer_json_sha256": tokenizer_sha, "oracle": f"tokenizers {tokenizers.__version__}",
        "repeats": args.repeats, "command": "bench/tokenizer/run.py",
        "method": "one thread each; best of `repeats`, each repeat on a freshly loaded tokenizer: cold = its first "
                  "pass over the documents (empty cache), warm = a second pass (loom caches merged splits, HF's "
                  "BPE caches 10,000 words); HF via encode per document and via encode_batch and "
                  "encode_batch_fast with RAYON_NUM_THREADS=1; speedup_vs_best_hf against the fastest of the three",
        "datasets": results,
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
