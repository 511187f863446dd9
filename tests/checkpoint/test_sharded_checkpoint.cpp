// Shard boxes against Param::full_index (the layout the model itself uses), and the checkpoint
// protocol in one process: write, commit, read boxes back across shards, corrupt inputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/checksum.h"
#include "checkpoint/shard_boxes.h"
#include "checkpoint/sharded_checkpoint.h"
#include "comm/agreement.h"
#include "core/error.h"

namespace megatron::checkpoint {
namespace {

namespace fs = std::filesystem;

Param make_param(Shape shape, int dim, int stride, int rank, int size) {
  Param p;
  p.name = "w";
  p.shape = shape;
  p.tp_partition_dim = dim;
  p.tp_partition_stride = stride;
  p.tp_rank = rank;
  p.tp_size = size;
  return p;
}

// Row-major flat index of element k of box b inside `full`.
int64_t global_index(const Box& b, const Shape& full, int64_t k) {
  if (b.offset.size() == 1) return b.offset[0] + k;
  const int64_t r = k / b.extent[1], c = k % b.extent[1];
  return (b.offset[0] + r) * full[1] + b.offset[1] + c;
}

// Every element of every range maps where Param::full_index says, each exactly once.
void check_pieces(const Param& p, int64_t begin, int64_t numel) {
  const std::vector<Piece> pieces = shard_pieces(p, begin, numel);
  int64_t expect = begin;
  for (const Piece& piece : pieces) {
    ASSERT_EQ(piece.local_begin, expect) << "pieces must tile the range in local order";
    for (int64_t k = 0; k < piece.global.numel(); ++k) {
      ASSERT_EQ(global_index(piece.global, p.full_shape(), k), p.full_index(expect + k))
          << p.shape.str() << " dim " << p.tp_partition_dim << " stride " << p.tp_partition_stride
          << " rank " << p.tp_rank << " element " << expect + k;
    }
    expect += piece.global.numel();
  }
  EXPECT_EQ(expect, begin + numel);
}

TEST(ShardPieces, MatchFullIndexForEveryLayout) {
  struct Case {
    Shape shape;
    int dim, stride;
  };
  const Case cases[] = {{{6, 5}, -1, 1}, {{6, 5}, 0, 1}, {{6, 5}, 1, 1}, {{8, 3}, 0, 2},
                        {{12}, 0, 1},    {{12}, 0, 2},   {{7}, -1, 1}};
  for (const Case& c : cases) {
    for (int size : {1, 2, 4}) {
      for (int rank = 0; rank < size; ++rank) {
        const Param p = make_param(c.shape, c.dim, c.stride, rank, size);
        const int64_t n = p.shape.numel();
        check_pieces(p, 0, n);
        // Sub-ranges as the distributed optimizer cuts them: anywhere, any length.
        for (int64_t b = 0; b < n; b += 3) {
          for (int64_t len : {int64_t{1}, int64_t{4}, n - b}) {
            if (b + len <= n) check_pieces(p, b, len);
          }
        }
      }
    }
  }
}

// Unequal sections (Mamba's in-projection [z | x | B | C | dt], its convolution [x | B | C]):
// each section split over the ranks, a rank's shard the concatenation of its slices.
TEST(ShardPieces, UnequalSectionsMatchFullIndex) {
  const std::vector<int64_t> sections{8, 8, 4, 4, 2};  // 26 rows in all
  for (int size : {1, 2}) {
    for (int rank = 0; rank < size; ++rank) {
      for (const Shape& full : {Shape{26, 3}, Shape{26}}) {
        Shape local = full;
        local[0] = 26 / size;
        Param p = make_param(local, 0, 1, rank, size);
        p.tp_partition_sections = sections;
        const int64_t n = p.shape.numel();
        check_pieces(p, 0, n);
        for (int64_t b = 0; b < n; b += 5)
          for (int64_t len : {int64_t{1}, int64_t{7}, n - b})
            if (b + len <= n) check_pieces(p, b, len);
        if (size == 2 && rank == 1 && full.ndim() == 2) {
          // Local row 4 (x_1's first) is full row 8 + 4; local row 12 (dt_1) is 24 + 1.
          EXPECT_EQ(p.full_partition_position(4), 12);
          EXPECT_EQ(p.full_partition_position(12), 25);
          EXPECT_EQ(shard_pieces(p, 0, n).size(), 5U);  // one box per section
        }
      }
    }
  }
}

TEST(ShardPieces, WholeShardIsOneBoxPerStrideBlock) {
  // Rank 1 of 2 holds [gate_1 | up_1], 4 rows each, of a full [gate | up] of 2 x 8 rows.
  const Param swiglu = make_param({8, 3}, 0, 2, 1, 2);
  const std::vector<Piece> pieces = shard_pieces(swiglu, 0, 24);
  ASSERT_EQ(pieces.size(), 2U);
  EXPECT_EQ(pieces[0].global, (Box{{4, 0}, {4, 3}}));
  EXPECT_EQ(pieces[1].global, (Box{{12, 0}, {4, 3}}));
}

TEST(Boxes, IntersectAndCopyRegion) {
  const Box a{{0, 0}, {4, 4}}, b{{2, 1}, {4, 2}};
  EXPECT_EQ(intersect(a, b), (Box{{2, 1}, {2, 2}}));
  EXPECT_EQ(intersect(a, Box{{5, 0}, {1, 4}}).numel(), 0);
  std::vector<float> src(16);
  for (int i = 0; i < 16; ++i) src[i] = static_cast<float>(i);
  std::vector<float> dst(8, -1.0F);
  copy_region(src.data(), a, dst.data(), b, intersect(a, b));
  // b's rows 2..3 (of 4..5 beyond a: untouched), columns 1..2.
  EXPECT_EQ(dst, (std::vector<float>{9, 10, 13, 14, -1, -1, -1, -1}));
}

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("sharded_ckpt_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    group_ = make_self_process_group();
  }
  void TearDown() override { fs::remove_all(root_); }

  // A 4 x 3 tensor saved as two row boxes, and a 1-D one, at `iteration`.
  void save(int64_t iteration, float base) {
    const std::string staging = prepare_save(*group_, root_.string(), iteration);
    Tensor top = Tensor::empty({2, 3}), bottom = Tensor::empty({2, 3}), bias = Tensor::empty({5});
    for (int i = 0; i < 6; ++i) top.data<float>()[i] = base + static_cast<float>(i);
    for (int i = 0; i < 6; ++i) bottom.data<float>()[i] = base + 6.0F + static_cast<float>(i);
    for (int i = 0; i < 5; ++i) bias.data<float>()[i] = base - static_cast<float>(i);
    std::vector<ShardEntry> entries{{"m.w", {4, 3}, Box{{0, 0}, {2, 3}}, top},
                                    {"m.w", {4, 3}, Box{{2, 0}, {2, 3}}, bottom},
                                    {"m.b", {5}, Box{{0}, {5}}, bias}};
    const nlohmann::json record = write_rank_file(staging, 0, entries);
    commit_save(*group_, root_.string(), iteration, staging, record, "", {{"run", 1}});
  }
  std::string dir(int64_t it) const { return iteration_dir(root_.string(), it); }

  fs::path root_;
  std::shared_ptr<ProcessGroup> group_;
};

TEST_F(CheckpointFiles, CommitThenReadBoxesAcrossShards) {
  save(7, 100.0F);
  EXPECT_EQ(read_tracker(root_.string()), 7);
  EXPECT_FALSE(fs::exists(dir(7) + ".staging"));
  CheckpointReader r = CheckpointReader::open(dir(7), Integrity::kTensorsAndFiles);
  EXPECT_EQ(r.metadata().at("run"), 1);
  EXPECT_EQ(r.global_shape("m.w"), (std::vector<int64_t>{4, 3}));
  // Rows 1..2, columns 1..2: one element row from each shard.
  std::vector<float> got(4);
  r.read("m.w", Box{{1, 1}, {2, 2}}, got.data());
  EXPECT_EQ(got, (std::vector<float>{104, 105, 107, 108}));
  // A box reaching past the saved rows: only with allow_outside, and zero there.
  std::vector<float> wide(6, -1.0F);
  EXPECT_THROW(r.read("m.w", Box{{3, 0}, {2, 3}}, wide.data()), InvalidArgument);
  r.read("m.w", Box{{3, 0}, {2, 3}}, wide.data(), /*allow_outside=*/true);
  EXPECT_EQ(wide, (std::vector<float>{109, 110, 111, 0, 0, 0}));
  EXPECT_THROW(r.read("m.missing", Box{{0}, {1}}, wide.data()), InvalidArgument);
}

TEST_F(CheckpointFiles, ResavingAnIterationReplacesIt) {
  save(3, 0.0F);
  save(3, 50.0F);
  CheckpointReader r = CheckpointReader::open(dir(3));
  float v = 0;
  r.read("m.b", Box{{0}, {1}}, &v);
  EXPECT_EQ(v, 50.0F);
  EXPECT_FALSE(fs::exists(dir(3) + ".old"));
}

TEST_F(CheckpointFiles, FailedWriteLeavesThePreviousCheckpoint) {
  save(1, 0.0F);
  const std::string staging = prepare_save(*group_, root_.string(), 2);
  EXPECT_THROW(commit_save(*group_, root_.string(), 2, staging, {}, "disk full (test)", {}),
               AgreedFailure);
  EXPECT_EQ(read_tracker(root_.string()), 1);
  EXPECT_FALSE(fs::exists(dir(2)));
  EXPECT_FALSE(fs::exists(staging));
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointFiles, CorruptInputsNameTheFile) {
  save(5, 0.0F);
  const std::string shard = dir(5) + "/rank_00000.safetensors";
  // Tracker.
  std::ofstream(root_ / kTrackerFile) << "abc\n";
  expect_error([&] { read_tracker(root_.string()); }, std::string(kTrackerFile));
  EXPECT_FALSE(read_tracker((root_ / "nowhere").string()).has_value());
  // Truncated by one byte.
  fs::resize_file(shard, fs::file_size(shard) - 1);
  expect_error([&] { CheckpointReader::open(dir(5)); }, shard);
  fs::remove(shard);
  expect_error([&] { CheckpointReader::open(dir(5)); }, "is missing");
  save(6, 0.0F);
  // Truncated metadata.json.
  const std::string meta = dir(6) + "/" + kMetadataFile;
  fs::resize_file(meta, fs::file_size(meta) / 2);
  expect_error([&] { CheckpointReader::open(dir(6)); }, meta);
  // No metadata.json: never a checkpoint.
  fs::remove(meta);
  expect_error([&] { CheckpointReader::open(dir(6)); }, "has no metadata.json");
}

// Flips one bit in the second byte of tensor `key`'s payload (the file keeps its size).
void flip_payload_bit(const std::string& path, const std::string& key) {
  uint64_t begin = 0;
  {
    const safetensors::File f = safetensors::File::open(path);
    begin = f.info(key).begin;
  }
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  io.read(reinterpret_cast<char*>(&header), 8);
  const auto at = static_cast<std::streamoff>(8 + header + begin + 1);
  io.seekg(at);
  char c = 0;
  io.get(c);
  io.seekp(at);
  io.put(static_cast<char>(c ^ 1));
}

// A single flipped bit in a tensor's payload (the sizes all still match) is refused when that
// tensor is read, naming the file and the tensor; the file's other tensors, and boxes that do not
// need the damaged shard, still load. --no-verify-integrity (kSizesOnly) loads it unchecked;
// --verify-integrity (kTensorsAndFiles) refuses the whole file by its SHA-256.
TEST_F(CheckpointFiles, AFlippedPayloadBitIsRefusedNamingFileAndTensor) {
  save(6, 0.0F);
  const std::string shard = dir(6) + "/rank_00000.safetensors";
  flip_payload_bit(shard, "m.w@2,0");
  CheckpointReader r = CheckpointReader::open(dir(6));
  std::vector<float> w(12), b(5);
  r.read("m.b", Box{{0}, {5}}, b.data());
  r.read("m.w", Box{{0, 0}, {2, 3}}, w.data());  // rows 0..1: the undamaged shard only
  for (const std::string& needle :
       {shard, std::string("tensor m.w@2,0"), std::string("fails its checksum"),
        std::string("--no-verify-integrity")}) {
    expect_error([&] { r.read("m.w", Box{{0, 0}, {4, 3}}, w.data()); }, needle);
  }
  CheckpointReader unchecked = CheckpointReader::open(dir(6), Integrity::kSizesOnly);
  unchecked.read("m.w", Box{{0, 0}, {4, 3}}, w.data());
  EXPECT_NE(w[6], 6.0F);  // the damaged element, loaded as it is on disk
  EXPECT_EQ(w[7], 7.0F);
  CheckpointReader files = CheckpointReader::open(dir(6), Integrity::kTensorsAndFiles);
  expect_error([&] { files.read("m.b", Box{{0}, {5}}, b.data()); }, "--verify-integrity");
}

// metadata.json records each shard's XXH3-64; a checkpoint written before checksums existed (no
// "xxh3" fields) loads with the size checks only.
TEST_F(CheckpointFiles, ChecksumsAreRecordedAndOlderCheckpointsStillLoad) {
  save(8, 0.0F);
  const std::string meta = dir(8) + "/" + kMetadataFile;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(meta));
  for (auto& [name, t] : j["tensors"].items()) {
    for (auto& s : t["shards"]) {
      EXPECT_EQ(s.at("xxh3").get<std::string>().size(), 16U) << name;
      s.erase("xxh3");
    }
  }
  std::ofstream(meta) << j.dump(1);
  flip_payload_bit(dir(8) + "/rank_00000.safetensors", "m.b@0");
  CheckpointReader r = CheckpointReader::open(dir(8));
  std::vector<float> b(5);
  r.read("m.b", Box{{0}, {5}}, b.data());  // nothing to check it against
  EXPECT_NE(b[0], 0.0F);
}

TEST(Checksum, Xxh3MatchesTheReferenceValues) {
  // XXH3_64bits, seed 0: the empty input's value is xxHash's published one; "abc" pins what
  // checkpoints record (XXH3's output is fixed since xxHash 0.8.0).
  EXPECT_EQ(xxh3_hex("", 0), "2d06800538d394c2");
  EXPECT_EQ(xxh3_hex("abc", 3), "78af5f94892f3950");
}

}  // namespace
}  // namespace megatron::checkpoint
