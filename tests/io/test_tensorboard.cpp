#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tensorboard.h"
#include "io_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::string bytes_of(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

uint32_t le32(const std::string& bytes, size_t at) {
  uint32_t v;
  std::memcpy(&v, bytes.data() + at, 4);
  return v;
}

uint64_t le64(const std::string& bytes, size_t at) {
  uint64_t v;
  std::memcpy(&v, bytes.data() + at, 8);
  return v;
}

// The check values of CRC-32C: RFC 3720 (iSCSI) appendix B.4 and the "123456789" check.
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  // An iSCSI read command PDU (RFC 3720 B.4).
  std::string pdu = bytes_of({0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                              0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
                              0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
                              0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  EXPECT_EQ(crc32c(pdu), 0xD9963A56u);
  // Continuing a CRC over a second piece equals the CRC of the whole.
  EXPECT_EQ(crc32c("56789", crc32c("1234")), crc32c("123456789"));
}

TEST(Crc32c, MaskedAsTfRecordStoresIt) {
  EXPECT_EQ(crc32c_masked(""), 0xa282ead8u);  // crc 0 rotated is 0, plus the mask's delta
  // Every TensorFlow event file starts with the length 24 of its file_version event, and
  // this masked CRC of those 8 bytes: 18 00 00 00 00 00 00 00 a3 7f 4b 22.
  EXPECT_EQ(crc32c_masked(std::string("\x18\0\0\0\0\0\0\0", 8)), 0x224b7fa3u);
}

TEST(TfRecord, FrameLayout) {
  const std::string data = "hello";
  const std::string record = tfrecord_frame(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(le64(record, 0), data.size());
  EXPECT_EQ(le32(record, 8), crc32c_masked(record.substr(0, 8)));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(le32(record, 12 + data.size()), crc32c_masked(data));
}

TEST(TensorBoardEvent, VersionEventBytes) {
  // wall_time 1.0: key 0x09, the double's 8 bytes; file_version: key 0x1a, length 13.
  const std::string event = tensorboard_version_event(1.0);
  const std::string expected = bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x1a, 13}) + "brain.Event:2";
  EXPECT_EQ(event, expected);
  EXPECT_EQ(tfrecord_frame(event).substr(0, 12),
            bytes_of({0x18, 0, 0, 0, 0, 0, 0, 0, 0xa3, 0x7f, 0x4b, 0x22}));
}

TEST(TensorBoardEvent, ScalarEventBytes) {
  // step 300: varint ac 02; summary (key 0x2a) holding a value (key 0x0a) with tag "lr"
  // (key 0x0a) and simple_value 0.5f (key 0x15, bytes 00 00 00 3f).
  const std::string event = tensorboard_scalar_event(0.0, 300, "lr", 0.5f);
  const std::string expected =
      bytes_of({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0xac, 0x02, 0x2a, 11, 0x0a, 9, 0x0a, 2}) + "lr" +
      bytes_of({0x15, 0, 0, 0, 0x3f});
  EXPECT_EQ(event, expected);
}

// The records of every event file in `dir`, each frame's CRCs checked.
std::vector<std::string> read_records(const std::string& dir) {
  std::vector<std::string> records;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string bytes = test::read_bytes(entry.path().string());
    size_t at = 0;
    while (at < bytes.size()) {
      EXPECT_GE(bytes.size() - at, 12u);
      const uint64_t length = le64(bytes, at);
      EXPECT_EQ(le32(bytes, at + 8), crc32c_masked(bytes.substr(at, 8)));
      const std::string data = bytes.substr(at + 12, length);
      EXPECT_EQ(le32(bytes, at + 12 + length), crc32c_masked(data));
      records.push_back(data);
      at += 12 + length + 4;
    }
  }
  return records;
}

TEST(TensorBoardWriter, WritesFramedRecordsIntoANewFile) {
  TempDir tmp;
  const std::string dir = tmp.file("tensorboard");
  {
    TensorBoardWriter writer(dir);
    EXPECT_EQ(fs::path(writer.path()).parent_path(), fs::path(dir));
    EXPECT_EQ(fs::path(writer.path()).filename().string().rfind("events.out.tfevents.", 0), 0u);
    writer.add_scalar("lm loss", 1, 2.5);
    writer.add_scalar("lm loss", 2, 2.25);
    writer.flush();
  }
  std::vector<std::string> records = read_records(dir);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(records[2].find("lm loss"), std::string::npos);
}

// Runs `command`, returning its stdout and exit status.
std::pair<std::string, int> run_capture(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {"", -1};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// TensorBoard's own reader (the tensorboard package's EventAccumulator) reads loom's files.
TEST(TensorBoardWriter, TensorBoardEventAccumulatorReadsTheScalars) {
  const char* python = std::getenv("LOOM_PYTHON");
  if (!python || !*python)
    GTEST_SKIP() << "LOOM_PYTHON is not set (scripts/test.sh sets it to a Python with tensorboard); "
                    "the TensorBoard reader check did not run";
  TempDir tmp;
  const std::string dir = tmp.file("tensorboard");
  {
    TensorBoardWriter writer(dir);
    for (int64_t step = 1; step <= 5; ++step) {
      writer.add_scalar("lm loss", step, 5.0 - 0.5 * static_cast<double>(step));
      writer.add_scalar("lr", step, 1e-5 * static_cast<double>(step));
      writer.add_scalar("throughput", step, 2200.16);
    }
    writer.add_scalar("grad norm", 1000000007, 0.125);  // a step past 2^29: a 5-byte varint
    writer.flush();
  }
  const std::string command =
      std::string(python) + " " + LOOM_SOURCE_DIR + "/tests/io/read_tensorboard.py " + dir;
  auto [out, status] = run_capture(command);
  if (status == 77)
    GTEST_SKIP() << "LOOM_PYTHON has no tensorboard package (scripts/python_env.sh installs it)";
  ASSERT_EQ(status, 0) << command;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tags"], nlohmann::json({"grad norm", "lm loss", "lr", "throughput"}));
  const auto& loss = j["scalars"]["lm loss"];
  ASSERT_EQ(loss.size(), 5u);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(loss[i][0].get<int64_t>(), i + 1);
    EXPECT_DOUBLE_EQ(loss[i][1].get<double>(), 5.0 - 0.5 * static_cast<double>(i + 1));
    EXPECT_FLOAT_EQ(j["scalars"]["lr"][i][1].get<float>(),
                    static_cast<float>(1e-5 * static_cast<double>(i + 1)));
  }
  EXPECT_FLOAT_EQ(j["scalars"]["throughput"][0][1].get<float>(), 2200.16f);
  EXPECT_EQ(j["scalars"]["grad norm"][0][0].get<int64_t>(), 1000000007);
}

}  // namespace
}  // namespace loom
