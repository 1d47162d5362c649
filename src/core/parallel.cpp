#include "core/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {
namespace {

// A fixed pool: a worker waits for a generation bump, runs its chunk, reports done.
class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      ++generation_;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void run(int chunks, const std::function<void(int)>& task) {
    std::unique_lock<std::mutex> run_lock(run_mutex_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lock(mutex_);
      task_ = &task;
      chunks_ = chunks;
      pending_ = static_cast<int>(workers_.size());
      ++generation_;
    }
    wake_.notify_all();
    if (chunks > 0) task(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task = nullptr;
      int chunks = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        task = task_;
        chunks = chunks_;
      }
      if (index < chunks) (*task)(index);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (--pending_ == 0) done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_, run_mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* task_ = nullptr;
  int chunks_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

int configured_threads() {
  if (const char* env = std::getenv("LOOM_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool& pool() {
  static ThreadPool instance(configured_threads());
  return instance;
}

thread_local bool in_parallel_region = false;

}  // namespace

int worker_count() { return pool().size(); }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
  int chunks = static_cast<int>(std::min<int64_t>(worker_count(), max_chunks));
  // Nested regions and small jobs run inline.
  if (chunks <= 1 || in_parallel_region) {
    body(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  pool().run(chunks, [&](int c) {
    in_parallel_region = true;
    int64_t begin = c * per;
    int64_t end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
    in_parallel_region = false;
  });
}

}  // namespace loom
