// TensorBoard event files: scalars per step, readable by TensorBoard and its
// EventAccumulator, written without a protobuf library.
//
// An event file is a sequence of TFRecords, each
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data[length] |
//   uint32 masked_crc32c(data)
// masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C (Castagnoli) of x.
// Each record's data is a serialized tensorflow.Event (tensorflow/core/util/event.proto):
//   1: double wall_time (seconds since the epoch) | 2: int64 step |
//   3: string file_version ("brain.Event:2", the first record) | 5: Summary summary
// Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value = 2 }.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace loom {

// CRC-32C (polynomial 0x1EDC6F41, reflected 0x82F63B78) of `data`, continuing from `crc`
// (0 to start): crc32c("123456789") = 0xE3069283.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// The masked form TFRecord stores.
uint32_t crc32c_masked(std::string_view data);

// One TFRecord: the length, its masked CRC, the data, the data's masked CRC.
std::string tfrecord_frame(std::string_view data);

// A serialized Event holding one scalar summary (tag, simple_value) at `step`.
std::string tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// The serialized first Event of a file: file_version "brain.Event:2".
std::string tensorboard_version_event(double wall_time);

// Appends scalar events to a new event file in `dir` (created when missing), named
// events.out.tfevents.<unix seconds>.<host>.<pid> so that every run invocation adds its
// own file (TensorBoard reads every file of a folder). A log, not an atomic output: each
// flush() leaves whole records, so TensorBoard can read the file while training runs.
// Write failures throw RuntimeFailure naming the file.
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(std::string_view tag, int64_t step, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace loom
