// Progress of long work on stderr: a bar with rate and ETA redrawn in place on a terminal,
// plain periodic lines otherwise (a log file, CI), or nothing.
//
//   bar:   "tokenizing [#############.................] 45% (450.0 of 1000.0 MB), 41.2 MB/s, ETA 0:13"
//          redrawn in place at most every 0.2 s;
//   lines: "loom: tokenizing 45% (450.0 of 1000.0 MB), 41.2 MB/s, ETA 0:13"
//          every `line_interval_s` (10 s), so a log gets a line per interval and no more.
// Either ends with "loom: tokenizing done: 1000.0 MB in 24.3 s (41.2 MB/s)".
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace loom {

enum class ProgressStyle { bar, lines, none };

// bar when stderr is a terminal, lines otherwise.
ProgressStyle progress_style_for_stderr();

class Progress {
 public:
  // `total` units of work (0: unknown, no percentage or ETA). unit "MB" reports bytes as
  // megabytes (10^6); any other unit is a plain count ("conversations").
  Progress(std::string label, double total, std::string unit, ProgressStyle style, std::FILE* out = stderr,
           double line_interval_s = 10.0);
  // Reports `done` units finished (monotone); draws when the style's interval has passed.
  void update(double done);
  // The closing line; called once.
  void finish(double done);

 private:
  using Clock = std::chrono::steady_clock;
  std::string status(double done, double seconds) const;
  double scaled(double units) const;
  std::string amount(double units) const;

  std::string label_, unit_;
  double total_;
  ProgressStyle style_;
  std::FILE* out_;
  double line_interval_s_;
  Clock::time_point start_, last_draw_;
  bool drawn_ = false;
};

}  // namespace loom
