// Tests of the safetensors reader and writer and of Hugging Face model directories.
//
// Interoperability is checked against bytes that did not come from our writer: the reference
// implementation's own test vectors (which pin its exact writer output) and files assembled by
// hand from a header string and raw numbers. Every rejection is checked for the file's path and
// a word that tells the problem apart from the others.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "checkpoint/safetensors_dir.h"
#include "testing/testing.h"

namespace megatron::safetensors {
namespace {

namespace fs = std::filesystem;
using Named = std::vector<std::pair<std::string, Tensor>>;

std::string scratch() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return testing::scratch_dir(std::string("safetensors_") + info->test_suite_name() + "_" +
                              info->name());
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A safetensors file as the format defines it: length, header text, data.
std::string file_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

template <typename T>
std::string raw(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

std::string from_array(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

// Succeeds when f throws InvalidArgument whose message contains every word.
template <typename F>
::testing::AssertionResult throws_invalid(F&& f, std::initializer_list<std::string> words) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const std::string& w : words) {
      if (msg.find(w) == std::string::npos) {
        return ::testing::AssertionFailure() << "message lacks \"" << w << "\": " << msg;
      }
    }
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure()
           << "threw something other than InvalidArgument: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Names in dir that look like a writer's leftover temporary file.
std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

Tensor ints32(std::initializer_list<int32_t> v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::memcpy(t.raw(), v.begin(), t.nbytes());
  return t;
}

TEST(Safetensors, RoundTripsEverySupportedDtype) {
  const std::string path = scratch() + "/all.safetensors";
  Tensor i64 = Tensor::empty({3}, DType::kI64);
  i64.data<int64_t>()[0] = -7;
  i64.data<int64_t>()[1] = int64_t{1} << 40;
  i64.data<int64_t>()[2] = INT64_MAX;
  const Named tensors = {
      {"f64", testing::random_tensor({2, 3}, 1, 1.0, DType::kF64)},
      {"f32", testing::random_tensor({4}, 2, 1.0, DType::kF32)},
      {"bf16", testing::random_tensor({3, 2}, 3, 4.0, DType::kBF16)},
      {"f16", testing::random_tensor({1, 5}, 4, 2.0, DType::kF16)},
      {"i64", i64},
      {"i32", ints32({-1, 0, 1, INT32_MAX}, {2, 2})},
      {"scalar", Tensor::full(Shape{}, 3.5, DType::kF32)},
      {"empty", Tensor::empty({0, 3}, DType::kF32)},
      {"empty_ids", Tensor::empty({0}, DType::kI64)},
      {"six_dims", testing::random_tensor({1, 2, 1, 2, 1, 2}, 5)},
  };
  write(path, tensors, {{"format", "pt"}, {"note", "round trip"}});

  File f = File::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.tensors().size(), tensors.size());
  EXPECT_EQ(f.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "round trip"}}));
  for (const auto& [name, want] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    const TensorInfo& info = f.info(name);
    EXPECT_EQ(info.name, name);
    EXPECT_EQ(info.dtype, want.dtype());
    EXPECT_EQ(info.shape, want.shape());
    EXPECT_EQ(info.end - info.begin, want.nbytes());
    Tensor got = f.read(name);
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_EQ(bytes_of(got), bytes_of(want));
    EXPECT_EQ(std::string(static_cast<const char*>(f.data(name)), want.nbytes()), bytes_of(want));
  }
  EXPECT_EQ(f.read("scalar").ndim(), 0);
  EXPECT_EQ(f.read("scalar").item(), 3.5);
  EXPECT_EQ(f.read("empty").numel(), 0);

  // Copies outlive the file; a moved File keeps working.
  Tensor kept = f.read("f32");
  File moved = std::move(f);
  EXPECT_EQ(bytes_of(moved.read("f64")), bytes_of(tensors[0].second));
  moved = File::open(path);
  EXPECT_EQ(bytes_of(kept), bytes_of(tensors[1].second));
}

TEST(Safetensors, WriterMatchesReferenceBytes) {
  // The reference implementation's test vectors: its writer's exact output for these inputs.
  const std::string dir = scratch();
  const Tensor attn = Tensor::empty({1, 2, 3});
  for (int64_t i = 0; i < 6; ++i) attn.data<float>()[i] = static_cast<float>(i);

  write(dir + "/a.safetensors", {{"attn.0", attn}});
  EXPECT_EQ(
      read_bytes(dir + "/a.safetensors"),
      from_array({64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
                  34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
                  44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
                  44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
                  91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
                  0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64}));

  // A shorter name: the header is padded with spaces so the data stays 8-byte aligned.
  write(dir + "/b.safetensors", {{"attn0", attn.view({1, 1, 2, 3})}});
  EXPECT_EQ(read_bytes(dir + "/b.safetensors"),
            from_array({72,  0,   0,   0,   0,   0,   0,   0,   123, 34, 97, 116, 116, 110, 48,
                        34,  58,  123, 34,  100, 116, 121, 112, 101, 34, 58, 34,  70,  51,  50,
                        34,  44,  34,  115, 104, 97,  112, 101, 34,  58, 91, 49,  44,  49,  44,
                        50,  44,  51,  93,  44,  34,  100, 97,  116, 97, 95, 111, 102, 102, 115,
                        101, 116, 115, 34,  58,  91,  48,  44,  50,  52, 93, 125, 125, 32,  32,
                        32,  32,  32,  32,  32,  0,   0,   0,   0,   0,  0,  128, 63,  0,   0,
                        0,   64,  0,   0,   64,  64,  0,   0,   128, 64, 0,  0,   160, 64}));

  write(dir + "/c.safetensors", {});
  EXPECT_EQ(read_bytes(dir + "/c.safetensors"),
            from_array({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
  write(dir + "/d.safetensors", {}, {{"framework", "pt"}});
  EXPECT_EQ(
      read_bytes(dir + "/d.safetensors"),
      from_array({40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                  100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                  111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32}));
}

TEST(Safetensors, WriterOrdersByAlignmentThenNameAndPadsHeader) {
  const std::string path = scratch() + "/order.safetensors";
  const Named tensors = {
      {"b", Tensor::full({2}, 1, DType::kF16)},  {"a", Tensor::full({1}, 2, DType::kF32)},
      {"c", Tensor::full({1}, 3, DType::kI64)},  {"z", Tensor::full({1}, 4, DType::kF64)},
      {"y", Tensor::full({1}, 5, DType::kI32)},  {"x", Tensor::full({1}, 6, DType::kBF16)},
      {"a2", Tensor::full({2}, 7, DType::kF32)},
  };
  write(path, tensors, {{"format", "pt"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("c":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                           R"("z":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                           R"("a":{"dtype":"F32","shape":[1],"data_offsets":[16,20]},)"
                           R"("a2":{"dtype":"F32","shape":[2],"data_offsets":[20,28]},)"
                           R"("y":{"dtype":"I32","shape":[1],"data_offsets":[28,32]},)"
                           R"("x":{"dtype":"BF16","shape":[1],"data_offsets":[32,34]},)"
                           R"("b":{"dtype":"F16","shape":[2],"data_offsets":[34,38]}})";
  ASSERT_EQ(n, (json.size() + 7) / 8 * 8);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(0, json.size()), json);
  EXPECT_EQ(header.substr(json.size()), std::string(n - json.size(), ' '));
  std::string data;
  for (const char* name : {"c", "z", "a", "a2", "y", "x", "b"}) {
    for (const auto& [tname, t] : tensors) {
      if (tname == name) data += bytes_of(t);
    }
  }
  EXPECT_EQ(bytes.substr(8 + n), data);
}

TEST(Safetensors, ReadsFilesFromOtherWriters) {
  const std::string dir = scratch();
  // Keys out of offset order, header not a multiple of 8, spaces inside, unknown fields ignored.
  const std::string header =
      R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24], "extra": 1},)"
      R"( "__metadata__": {"format": "pt"},)"
      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
      R"( "h": {"shape": [], "dtype": "BF16", "data_offsets": [24, 26]},)"
      R"( "e": {"dtype": "I64", "shape": [3, 0], "data_offsets": [26, 26]}})";
  ASSERT_NE(header.size() % 8, 0u);
  const std::string path = dir + "/hand.safetensors";
  write_bytes(path,
              file_bytes(header, raw<float>({0.5f, -1.25f}) + raw<float>({1.f, 2.f, 3.f, 4.f}) +
                                     from_array({0x80, 0x3f})));
  File f = File::open(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 4u);
  Tensor w = f.read("w");
  EXPECT_EQ(w.shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w.data<float>()[i], static_cast<float>(i + 1));
  Tensor b = f.read("b");
  EXPECT_EQ(b.data<float>()[0], 0.5f);
  EXPECT_EQ(b.data<float>()[1], -1.25f);
  EXPECT_EQ(f.read("h").dtype(), DType::kBF16);
  EXPECT_EQ(f.read("h").item(), 1.0);
  EXPECT_EQ(f.read("e").shape(), (Shape{3, 0}));
  EXPECT_EQ(f.info("w").begin, 8u);
  float third;
  std::memcpy(&third, static_cast<const char*>(f.data("w")) + 8, 4);
  EXPECT_EQ(third, 3.f);

  // The reference implementation's deserialization vector (header length 60).
  const std::string ref = dir + "/ref.safetensors";
  write_bytes(ref, le64(60) + R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                       std::string(16, '\0'));
  File g = File::open(ref);
  EXPECT_EQ(g.read("test").shape(), (Shape{2, 2}));
  EXPECT_EQ(g.read("test").dtype(), DType::kI32);
  EXPECT_TRUE(g.metadata().empty());

  // Headers may be padded with any JSON whitespace, before or after; no tensors is fine.
  const std::string ws = dir + "/ws.safetensors";
  write_bytes(ws, file_bytes("\t\n{}\r "));
  EXPECT_TRUE(File::open(ws).tensors().empty());
}

TEST(Safetensors, MissingTensorNamesTensorAndFile) {
  const std::string path = scratch() + "/one.safetensors";
  write(path, {{"present", Tensor::zeros({2})}});
  File f = File::open(path);
  EXPECT_FALSE(f.contains("absent"));
  EXPECT_TRUE(throws_invalid([&] { f.info("absent"); }, {path, "'absent'", "not found"}));
  EXPECT_TRUE(throws_invalid([&] { f.read("absent"); }, {path, "'absent'"}));
}

TEST(Safetensors, RejectsCorruptFiles) {
  const std::string dir = scratch();
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string ok = file_bytes(ok_header, raw<float>({1.f, 2.f}));
  struct Case {
    const char* name;
    std::string bytes;
    std::vector<std::string> words;
  };
  const std::vector<Case> cases = {
      {"short", std::string(5, '\0'), {"too short", "5 bytes"}},
      {"empty_file", "", {"too short", "0 bytes"}},
      {"header_too_big", le64(200'000'000) + "{}", {"header length 200000000", "limit"}},
      {"header_past_end", le64(1000) + "{}", {"header length 1000", "truncated"}},
      {"bad_json", file_bytes(R"({"w": {"dtype": )"), {"not valid JSON"}},
      {"not_utf8", file_bytes("\xff"), {"not valid JSON"}},
      {"not_object", file_bytes("[1, 2]"), {"JSON object"}},
      {"entry_not_object", file_bytes(R"({"w": 3})"), {"'w'", "JSON object"}},
      {"unsupported_dtype",
       file_bytes(R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", "abcd"),
       {"'q'", "unsupported dtype I8", "F32"}},
      {"unknown_dtype",
       file_bytes(R"({"q":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
                  std::string(16, '\0')),
       {"'q'", "unknown dtype F128"}},
      {"missing_field",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", std::string(8, 0)),
       {"'w'", "missing field \"data_offsets\""}},
      {"negative_dim",
       file_bytes(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0)),
       {"'w'", "non-negative"}},
      {"float_dim",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", std::string(8, 0)),
       {"'w'", "non-negative integers"}},
      {"seven_dims",
       file_bytes(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
                  std::string(4, 0)),
       {"'w'", "at most 6"}},
      {"bad_offsets",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", std::string(8, 0)),
       {"'w'", "[begin, end]"}},
      {"end_before_begin",
       file_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", std::string(8, 0)),
       {"'w'", "end before"}},
      {"wrong_byte_count",
       file_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                  std::string(12, 0)),
       {"'w'", "needs 16 bytes", "span 12 bytes"}},
      {"overflow",
       file_bytes(R"({"w":{"dtype":"I32","shape":[2,9223372036854775807],)"
                  R"("data_offsets":[0,16]}})",
                  std::string(16, 0)),
       {"'w'", "overflows"}},
      {"gap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                  std::string(20, 0)),
       {"'b'", "not contiguous", "ends at 8"}},
      {"overlap",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  std::string(12, 0)),
       {"'b'", "not contiguous"}},
      {"not_at_zero",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(12, 0)),
       {"'a'", "not contiguous", "start at 0"}},
      {"truncated",
       ok.substr(0, ok.size() - 1),
       {"truncated", "1 byte short", std::to_string(ok.size())}},
      {"trailing", ok + "x", {"trailing bytes", "1 trailing byte", std::to_string(ok.size())}},
      {"metadata_not_string",
       file_bytes(R"({"__metadata__":{"n":1}})"),
       {"__metadata__", "\"n\"", "string"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir + "/" + c.name + ".safetensors";
    write_bytes(path, c.bytes);
    try {
      File::open(path);
      ADD_FAILURE() << "accepted";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const std::string& w : c.words) {
        EXPECT_NE(msg.find(w), std::string::npos) << "lacks \"" << w << "\": " << msg;
      }
    }
  }
  // The uncorrupted file is accepted, so each case above failed for its own reason.
  write_bytes(dir + "/ok.safetensors", ok);
  EXPECT_EQ(File::open(dir + "/ok.safetensors").read("w").item(1), 2.0);

  EXPECT_TRUE(throws_invalid([&] { File::open(dir + "/nope.safetensors"); },
                             {dir + "/nope.safetensors", "No such file"}));
  EXPECT_TRUE(throws_invalid([&] { File::open(dir); }, {dir, "directory"}));
}

TEST(Safetensors, WriteIntoMissingDirectoryNamesPath) {
  const std::string path = scratch() + "/no/such/dir/model.safetensors";
  EXPECT_TRUE(throws_invalid(
      [&] {
        write(path, {{"w", Tensor::zeros({2})}});
      },
      {path, "No such file or directory", "does the directory exist"}));
}

TEST(Safetensors, RejectedWritesLeavePreviousFileAndNoTemporary) {
  const std::string dir = scratch();
  const std::string path = dir + "/model.safetensors";
  write(path, {{"old", Tensor::full({4}, 1.0)}});
  const std::string before = read_bytes(path);

  EXPECT_TRUE(throws_invalid(
      [&] {
        write(path, {{"w", Tensor::zeros({2})}, {"w", Tensor::zeros({3})}});
      },
      {path, "duplicate", "'w'"}));
  EXPECT_TRUE(throws_invalid(
      [&] {
        write(path, {{"__metadata__", Tensor::zeros({2})}});
      },
      {path, "reserved"}));
  EXPECT_TRUE(throws_invalid([&] { write(path, {{"u", Tensor()}}); }, {path, "undefined"}));
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(temp_files(dir).empty());

  // The rename itself fails when the target is a directory; the temporary must still go.
  const std::string target_dir = dir + "/is_a_dir";
  fs::create_directories(target_dir + "/child");
  EXPECT_TRUE(throws_invalid(
      [&] {
        write(target_dir, {{"w", Tensor::zeros({2})}});
      },
      {target_dir, "renaming"}));
  EXPECT_TRUE(temp_files(dir).empty());
}

TEST(Safetensors, FailedWriteMidFileLeavesPreviousFileAndNoTemporary) {
  // A file-size limit makes write(2) fail with EFBIG part-way, as a full disk fails with ENOSPC.
  const std::string dir = scratch();
  const std::string path = dir + "/model.safetensors";
  write(path, {{"old", Tensor::full({4}, 1.0)}});
  const std::string before = read_bytes(path);

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 4096) GTEST_SKIP() << "hard limit";
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ::testing::AssertionResult result = throws_invalid(
      [&] {
        write(path, {{"big", Tensor::zeros({1 << 14})}});
      },
      {path, "File too large"});
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(result);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_TRUE(temp_files(dir).empty());
}

TEST(Safetensors, OverwritingAnOpenFileKeepsItsMapping) {
  const std::string path = scratch() + "/model.safetensors";
  write(path, {{"w", Tensor::full({3}, 1.0)}});
  File old_file = File::open(path);
  write(path, {{"w", Tensor::full({5}, 2.0)}});
  EXPECT_EQ(old_file.read("w").numel(), 3);
  EXPECT_EQ(old_file.read("w").item(2), 1.0);
  EXPECT_EQ(File::open(path).read("w").item(4), 2.0);
}

// --- Hugging Face model directories.

void write_index(const std::string& dir, const std::string& weight_map) {
  write_bytes(dir + "/" + SafetensorsDir::kIndexFile,
              R"({"metadata": {"total_size": 123}, "weight_map": )" + weight_map + "}");
}

TEST(SafetensorsDir, SingleFileRoundTrip) {
  const std::string dir = scratch();
  const Named tensors = {{"lm_head.weight", testing::random_tensor({3, 2}, 7)},
                         {"embed.weight", testing::random_tensor({4, 2}, 8, 1.0, DType::kBF16)}};
  SafetensorsDir::write(dir, tensors);
  EXPECT_EQ(File::open(dir + "/model.safetensors").metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}}));
  SafetensorsDir d = SafetensorsDir::open(dir);
  EXPECT_EQ(d.names(), (std::vector<std::string>{"embed.weight", "lm_head.weight"}));
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(d.contains(name));
    EXPECT_EQ(d.info(name).shape, t.shape());
    EXPECT_EQ(bytes_of(d.read(name)), bytes_of(t));
  }
  EXPECT_TRUE(throws_invalid([&] { d.info("nope"); }, {dir, "'nope'", "not found"}));
}

TEST(SafetensorsDir, ShardedIndex) {
  const std::string dir = scratch();
  const Tensor a = testing::random_tensor({2, 2}, 1), b = testing::random_tensor({3}, 2),
               c = testing::random_tensor({1}, 3, 1.0, DType::kF16);
  write(dir + "/model-00001-of-00002.safetensors", {{"a", a}, {"b", b}});
  // The second shard holds a tensor the index does not list; it is not exposed.
  write(dir + "/model-00002-of-00002.safetensors", {{"c", c}, {"unlisted", a}});
  write_index(dir, R"({"a": "model-00001-of-00002.safetensors",
                      "b": "model-00001-of-00002.safetensors",
                      "c": "model-00002-of-00002.safetensors"})");
  SafetensorsDir d = SafetensorsDir::open(dir);
  EXPECT_EQ(d.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(bytes_of(d.read("a")), bytes_of(a));
  EXPECT_EQ(bytes_of(d.read("b")), bytes_of(b));
  EXPECT_EQ(bytes_of(d.read("c")), bytes_of(c));
  EXPECT_EQ(d.info("c").dtype, DType::kF16);
  EXPECT_FALSE(d.contains("unlisted"));
  // Moving keeps the mappings.
  SafetensorsDir moved = std::move(d);
  EXPECT_EQ(bytes_of(moved.read("c")), bytes_of(c));
}

TEST(SafetensorsDir, RejectsBrokenDirectories) {
  const std::string dir = scratch();
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {dir, "model.safetensors ", "model.safetensors.index.json"}));
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir + "/absent"); },
                             {dir + "/absent", "does not exist"}));

  write(dir + "/shard1.safetensors", {{"a", Tensor::zeros({2})}});
  write_index(dir, R"({"a": "shard1.safetensors", "b": "shard2.safetensors"})");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {"model.safetensors.index.json", "shard2.safetensors", "missing"}));

  write_index(dir, R"({"a": "shard1.safetensors", "z": "shard1.safetensors"})");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {"model.safetensors.index.json", "'z'", "shard1.safetensors"}));

  write_index(dir, R"({"a": 1})");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {"model.safetensors.index.json", "'a'", "shard file name"}));

  write_bytes(dir + "/model.safetensors.index.json", "{not json");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {"model.safetensors.index.json", "not valid JSON"}));

  write_bytes(dir + "/model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {"model.safetensors.index.json", "weight_map"}));

  // A corrupt shard is reported with the shard's own path.
  write_bytes(dir + "/shard1.safetensors", "abc");
  write_index(dir, R"({"a": "shard1.safetensors"})");
  EXPECT_TRUE(throws_invalid([&] { SafetensorsDir::open(dir); },
                             {dir + "/shard1.safetensors", "too short"}));
}

}  // namespace
}  // namespace megatron::safetensors
