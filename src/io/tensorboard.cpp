#include "io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace loom {
namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// A protobuf key: field number and wire type (0 varint, 1 64-bit, 2 length-delimited, 5 32-bit).
void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(out, field, 1);
  put_le(out, bits, 8);
}

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {  // proto3 leaves default values out
    put_key(event, 2, 0);
    put_varint(event, static_cast<uint64_t>(step));  // int64: two's complement, 10 bytes when negative
  }
  return event;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  crc = ~crc;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32c_masked(std::string_view data) {
  const uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string length;
  put_le(length, data.size(), 8);
  std::string out = length;
  put_le(out, crc32c_masked(length), 4);
  out.append(data);
  put_le(out, crc32c_masked(data), 4);
  return out;
}

std::string tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(summary_value, 2, 5);
  put_le(summary_value, bits, 4);
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_header(wall_time, step);
  put_bytes(event, 5, summary);
  return event;
}

std::string tensorboard_version_event(double wall_time) {
  std::string event = event_header(wall_time, 0);
  put_bytes(event, 3, "brain.Event:2");
  return event;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw_runtime_failure(dir, "cannot create the TensorBoard folder: " + error.message());
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const double now = now_s();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                                         "." + host + "." + std::to_string(getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw_runtime_failure(path_, std::string("cannot create: ") + std::strerror(errno));
  write_record(tensorboard_version_event(now));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, double value) {
  write_record(tensorboard_scalar_event(now_s(), step, tag, static_cast<float>(value)));
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0)
    throw_runtime_failure(path_, std::string("write failed: ") + std::strerror(errno));
}

void TensorBoardWriter::write_record(const std::string& data) {
  const std::string record = tfrecord_frame(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size())
    throw_runtime_failure(path_, std::string("write failed: ") + std::strerror(errno));
}

}  // namespace loom
