// Tests of IndexedDataset and IndexedDatasetBuilder: Megatron's .bin/.idx pair.
//
// Interoperability is checked against an independent implementation of the format
// (tests/data/idx_independent.py, NumPy, written from the format's description): it reads what our
// builder writes and writes what our reader must accept, each compared document by document. Every
// kind of corruption is made by editing valid files byte by byte and must be rejected at open with
// the file and the field named. `megatron preprocess` itself is tested end to end by the same
// script.
#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "testing/testing.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;
using Document = std::vector<std::vector<int64_t>>;

std::string scratch() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return testing::scratch_dir(std::string("indexed_dataset_") + info->test_suite_name() + "_" +
                              info->name());
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Random documents in [lo, hi]: empty documents, several sequences, empty sequences, both ends
// of the range.
std::vector<Document> random_documents(uint64_t seed, int64_t lo, int64_t hi, int count = 200) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> id(lo, hi);
  std::vector<Document> docs;
  for (int k = 0; k < count; ++k) {
    Document doc;
    if (k % 13 != 5) {
      const int seqs = 1 + static_cast<int>(rng() % 3);
      for (int s = 0; s < seqs; ++s) {
        const int64_t n = std::vector<int64_t>{0, 1, 7, 300}[rng() % 4];
        std::vector<int64_t> seq;
        for (int64_t i = 0; i < n; ++i) seq.push_back(i % 11 == 0 ? (i % 2 ? lo : hi) : id(rng));
        doc.push_back(std::move(seq));
      }
    }
    docs.push_back(std::move(doc));
  }
  return docs;
}

void build(const std::string& prefix, IndexDType dtype, const std::vector<Document>& docs) {
  IndexedDatasetBuilder b(prefix + ".bin", dtype);
  for (const Document& doc : docs) {
    for (const auto& seq : doc) b.add_item(seq);
    b.end_document();
  }
  b.finalize(prefix + ".idx");
}

void expect_documents(const IndexedDataset& ds, const std::vector<Document>& want) {
  ASSERT_EQ(ds.num_documents(), static_cast<int64_t>(want.size()));
  const auto doc_idx = ds.document_indices();
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(doc_idx[k + 1] - doc_idx[k], static_cast<int64_t>(want[k].size())) << "doc " << k;
    for (size_t s = 0; s < want[k].size(); ++s) {
      const int64_t i = doc_idx[k] + static_cast<int64_t>(s);
      ASSERT_EQ(ds.sequence_lengths()[static_cast<size_t>(i)],
                static_cast<int32_t>(want[k][s].size()));
      std::vector<int64_t> got(want[k][s].size());
      ds.read(i, 0, static_cast<int64_t>(got.size()), got.data());
      ASSERT_EQ(got, want[k][s]) << "document " << k << ", sequence " << s;
    }
  }
}

std::string python_cmd(const std::string& args) {
  return std::string(MEGATRON_TEST_PYTHON) + " " + MEGATRON_IDX_INDEPENDENT_PY + " " + args;
}

struct DTypeCase {
  IndexDType dtype;
  const char* name;
  int64_t lo, hi;
};

const DTypeCase kDTypes[] = {
    {IndexDType::kUInt8, "uint8", 0, 255},
    {IndexDType::kInt8, "int8", -128, 127},
    {IndexDType::kInt16, "int16", -32768, 32767},
    {IndexDType::kInt32, "int32", INT32_MIN, INT32_MAX},
    {IndexDType::kInt64, "int64", -(int64_t{1} << 40), int64_t{1} << 40},
    {IndexDType::kFloat64, "float64", -1000, 1000},
    {IndexDType::kFloat32, "float32", -1000, 1000},
    {IndexDType::kUInt16, "uint16", 0, 65535},
};

TEST(IndexedDataset, DtypeForVocabularyFollowsMegatron) {
  EXPECT_EQ(index_dtype_for_vocab(50257), IndexDType::kUInt16);  // GPT-2
  EXPECT_EQ(index_dtype_for_vocab(65499), IndexDType::kUInt16);
  EXPECT_EQ(index_dtype_for_vocab(65500), IndexDType::kInt32);   // Megatron's cut, not 65536
  EXPECT_EQ(index_dtype_for_vocab(128256), IndexDType::kInt32);  // Llama 3
  EXPECT_EQ(index_dtype_size(IndexDType::kUInt16), 2u);
  EXPECT_EQ(index_dtype_size(IndexDType::kFloat64), 8u);
}

TEST(IndexedDataset, RoundTripEveryDtype) {
  const std::string dir = scratch();
  for (const DTypeCase& c : kDTypes) {
    SCOPED_TRACE(c.name);
    const auto docs = random_documents(7, c.lo, c.hi);
    build(dir + "/" + c.name, c.dtype, docs);
    const IndexedDataset ds = IndexedDataset::open(dir + "/" + c.name);
    EXPECT_EQ(ds.dtype(), c.dtype);
    expect_documents(ds, docs);
  }
}

TEST(IndexedDataset, ReadsSlicesAndSurvivesMoves) {
  const std::string dir = scratch();
  std::vector<Document> docs = {{{1, 2, 3, 4, 5}}, {}, {{6, 7}, {8, 9, 10}}};
  build(dir + "/d", IndexDType::kUInt16, docs);
  IndexedDataset opened = IndexedDataset::open(dir + "/d");
  IndexedDataset ds = std::move(opened);  // spans and mapping move with it
  EXPECT_EQ(ds.num_sequences(), 3);
  EXPECT_EQ(ds.num_documents(), 3);
  EXPECT_EQ(std::vector<int64_t>(ds.document_indices().begin(), ds.document_indices().end()),
            (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(std::vector<int64_t>(ds.sequence_pointers().begin(), ds.sequence_pointers().end()),
            (std::vector<int64_t>{0, 10, 14}));
  int64_t out[3] = {-1, -1, -1};
  ds.read(0, 2, 3, out);
  EXPECT_EQ(std::vector<int64_t>(out, out + 3), (std::vector<int64_t>{3, 4, 5}));
  ds.read(2, 1, 2, out);
  EXPECT_EQ(std::vector<int64_t>(out, out + 2), (std::vector<int64_t>{9, 10}));
  ds.read(1, 2, 0, out);  // empty read at the end is fine
  EXPECT_THROW(ds.read(3, 0, 1, out), InvalidArgument);
  EXPECT_THROW(ds.read(0, 4, 2, out), InvalidArgument);
  EXPECT_THROW(ds.read(-1, 0, 1, out), InvalidArgument);
}

TEST(IndexedDataset, EmptyDataset) {
  const std::string dir = scratch();
  build(dir + "/e", IndexDType::kUInt16, {});
  EXPECT_EQ(fs::file_size(dir + "/e.bin"), 0u);
  EXPECT_EQ(fs::file_size(dir + "/e.idx"), 34u + 8u);
  const IndexedDataset ds = IndexedDataset::open(dir + "/e");
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_documents(), 0);
}

TEST(IndexedDatasetBuilder, RejectsIdsOutsideTheDtype) {
  const std::string dir = scratch();
  IndexedDatasetBuilder b(dir + "/x.bin", IndexDType::kUInt16);
  const std::vector<int64_t> ok = {0, 65535};
  b.add_item(ok);
  const std::vector<int64_t> bad = {5, 65536};
  try {
    b.add_item(bad);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("x.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("65536"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("uint16"), std::string::npos) << e.what();
  }
  const std::vector<int64_t> negative = {-1};
  EXPECT_THROW(b.add_item(negative), InvalidArgument);
}

TEST(IndexedDatasetBuilder, NothingAppearsUntilFinalizeAndNothingIsLeftIfAbandoned) {
  const std::string dir = scratch();
  {
    IndexedDatasetBuilder b(dir + "/a.bin", IndexDType::kInt32);
    const std::vector<int64_t> seq = {1, 2, 3};
    b.add_item(seq);
    b.end_document();
    EXPECT_FALSE(fs::exists(dir + "/a.bin"));
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "an abandoned builder left files";
  // Finalize replaces existing outputs.
  build(dir + "/a", IndexDType::kInt32, {{{1}}});
  build(dir + "/a", IndexDType::kInt32, {{{4, 5}}, {{6}}});
  expect_documents(IndexedDataset::open(dir + "/a"), {{{4, 5}}, {{6}}});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
}

TEST(IndexedDatasetBuilder, FinalizeNeedsTheLastDocumentClosed) {
  const std::string dir = scratch();
  IndexedDatasetBuilder b(dir + "/u.bin", IndexDType::kUInt16);
  const std::vector<int64_t> seq = {1};
  b.add_item(seq);
  EXPECT_THROW(b.finalize(dir + "/u.idx"), InvalidArgument);
}

// Megatron's add_index: another dataset's documents after this builder's, its .bin bytes copied;
// sequences added since the last end_document() join its first document (Megatron's extend of
// the offset document indices without their leading 0). Multimodal modes travel with their
// sequences, and each kind refuses the other.
TEST(IndexedDatasetBuilder, AddIndexAppendsAnotherDatasetAsMegatronDoes) {
  const std::string dir = scratch();
  const std::vector<Document> a = random_documents(11, 0, 65535, 40),
                              b = random_documents(12, 0, 65535, 30);
  build(dir + "/a", IndexDType::kUInt16, a);
  build(dir + "/b", IndexDType::kUInt16, b);
  {
    IndexedDatasetBuilder m(dir + "/m.bin", IndexDType::kUInt16);
    m.add_index(IndexedDataset::open(dir + "/a"));
    m.add_index(IndexedDataset::open(dir + "/b"));
    m.finalize(dir + "/m.idx");
  }
  std::vector<Document> ab = a;
  ab.insert(ab.end(), b.begin(), b.end());
  expect_documents(IndexedDataset::open(dir + "/m"), ab);

  IndexedDatasetBuilder open_doc(dir + "/o.bin", IndexDType::kUInt16);
  const std::vector<int64_t> pending = {7, 8};
  open_doc.add_item(pending);
  open_doc.add_index(IndexedDataset::open(dir + "/b"));
  open_doc.finalize(dir + "/o.idx");
  std::vector<Document> spliced = b;
  spliced[0].insert(spliced[0].begin(), pending);
  expect_documents(IndexedDataset::open(dir + "/o"), spliced);

  {
    IndexedDatasetBuilder mm(dir + "/mm.bin", IndexDType::kUInt16, /*multimodal=*/true);
    const std::vector<int64_t> s1 = {1, 2}, s2 = {3};
    mm.add_item(s1, 2);
    mm.add_item(s2, -1);
    mm.end_document();
    mm.finalize(dir + "/mm.idx");
  }
  EXPECT_THROW(IndexedDataset::open(dir + "/mm"), InvalidArgument);  // a text reader refuses
  const IndexedDataset mm = IndexedDataset::open(dir + "/mm", /*multimodal=*/true);
  ASSERT_EQ(mm.sequence_modes().size(), 2u);
  EXPECT_EQ(mm.sequence_modes()[0], 2);
  EXPECT_EQ(mm.sequence_modes()[1], -1);
  IndexedDatasetBuilder mm2(dir + "/mm2.bin", IndexDType::kUInt16, true);
  mm2.add_index(mm);
  mm2.add_index(mm);
  mm2.finalize(dir + "/mm2.idx");
  const IndexedDataset twice = IndexedDataset::open(dir + "/mm2", true);
  EXPECT_EQ(std::vector<int8_t>(twice.sequence_modes().begin(), twice.sequence_modes().end()),
            (std::vector<int8_t>{2, -1, 2, -1}));
  EXPECT_THROW(IndexedDataset::open(dir + "/a", true), InvalidArgument);  // text is not multimodal
  IndexedDatasetBuilder text(dir + "/t.bin", IndexDType::kUInt16);
  EXPECT_THROW(text.add_index(mm), InvalidArgument);
  IndexedDatasetBuilder wide(dir + "/w.bin", IndexDType::kInt32);
  EXPECT_THROW(wide.add_index(IndexedDataset::open(dir + "/a")), InvalidArgument);
}

TEST(IndexedDatasetBuilder, MissingFolderIsNamed) {
  const std::string dir = scratch();
  try {
    IndexedDatasetBuilder b(dir + "/no/such/x.bin", IndexDType::kUInt16);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/x.bin"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Against the independent implementation.

std::vector<Document> load_documents(const std::string& json_path) {
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<Document> docs;
  for (const auto& d : j) {
    Document doc;
    for (const auto& s : d) doc.push_back(s.get<std::vector<int64_t>>());
    docs.push_back(std::move(doc));
  }
  return docs;
}

void save_documents(const std::string& json_path, const std::vector<Document>& docs) {
  nlohmann::json j = nlohmann::json::array();
  for (const Document& d : docs) j.push_back(d);
  std::ofstream(json_path) << j.dump();
}

TEST(IndependentImplementation, ReadsWhatOurBuilderWrites) {
  const std::string dir = scratch();
  for (const DTypeCase& c : kDTypes) {
    SCOPED_TRACE(c.name);
    const std::string prefix = dir + "/ours_" + c.name;
    const auto docs = random_documents(11, c.lo, c.hi);
    build(prefix, c.dtype, docs);
    save_documents(prefix + ".json", docs);
    EXPECT_EQ(std::system(python_cmd("verify --prefix " + prefix + " --expect " + prefix +
                                     ".json --dtype " + c.name)
                              .c_str()),
              0);
  }
}

TEST(IndependentImplementation, WeReadWhatItWrites) {
  const std::string dir = scratch();
  for (const DTypeCase& c : kDTypes) {
    SCOPED_TRACE(c.name);
    const std::string prefix = dir + "/theirs_" + c.name;
    ASSERT_EQ(std::system(python_cmd("write --prefix " + prefix + " --dtype " + c.name +
                                     " --seed 5 --expect " + prefix + ".json")
                              .c_str()),
              0);
    const IndexedDataset ds = IndexedDataset::open(prefix);
    EXPECT_EQ(ds.dtype(), c.dtype);
    expect_documents(ds, load_documents(prefix + ".json"));
  }
}

// ---------------------------------------------------------------------------------------------
// Corruption: a valid pair from the independent writer, edited one way per case.

struct Corruption {
  const char* name;
  // Edits the .idx and .bin bytes (the .bin removed when set to "\x01missing").
  std::function<void(std::string& idx, std::string& bin)> edit;
  const char* file;   // ".idx" or ".bin": the file the message must name
  const char* field;  // the field the message must name
};

// Test names print the case, not the struct's bytes.
void PrintTo(const Corruption& c, std::ostream* os) {
  *os << c.name;
}

void put_u64(std::string& s, size_t at, uint64_t v) {
  std::memcpy(s.data() + at, &v, 8);
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
// Offsets of the arrays for the file's own counts.
size_t pointers_at(const std::string& idx) {
  return 34 + 4 * get_u64(idx, 18);
}
size_t documents_at(const std::string& idx) {
  return 34 + 12 * get_u64(idx, 18);
}

class CorruptionTest : public ::testing::TestWithParam<Corruption> {};

TEST_P(CorruptionTest, IsRejectedNamingFileAndField) {
  const Corruption& c = GetParam();
  const std::string dir = testing::scratch_dir(std::string("indexed_dataset_corrupt_") + c.name);
  const std::string prefix = dir + "/data_text_document";
  ASSERT_EQ(std::system(python_cmd("write --prefix " + prefix +
                                   " --dtype uint16 --seed 9 "
                                   "--expect " +
                                   dir + "/docs.json")
                            .c_str()),
            0);
  ASSERT_NO_THROW(IndexedDataset::open(prefix));  // valid before the edit
  std::string idx = read_bytes(prefix + ".idx"), bin = read_bytes(prefix + ".bin");
  c.edit(idx, bin);
  write_bytes(prefix + ".idx", idx);
  if (bin == "\x01missing") {
    fs::remove(prefix + ".bin");
  } else {
    write_bytes(prefix + ".bin", bin);
  }
  try {
    IndexedDataset::open(prefix);
    FAIL() << "corruption '" << c.name << "' was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(prefix + c.file), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.field), std::string::npos) << msg;
  }
}

const Corruption kCorruptions[] = {
    {"bad_magic", [](std::string& idx, std::string&) { idx[3] = 'X'; }, ".idx", "magic"},
    {"wrong_version", [](std::string& idx, std::string&) { put_u64(idx, 9, 2); }, ".idx",
     "version is 2"},
    {"unknown_dtype", [](std::string& idx, std::string&) { idx[17] = 9; }, ".idx",
     "dtype code is 9"},
    {"truncated_header", [](std::string& idx, std::string&) { idx.resize(20); }, ".idx", "header"},
    {"truncated_idx", [](std::string& idx, std::string&) { idx.resize(idx.size() - 8); }, ".idx",
     "document_count"},
    {"sequence_count_mismatch",
     [](std::string& idx, std::string&) { put_u64(idx, 18, get_u64(idx, 18) + 1); }, ".idx",
     "sequence_count"},
    {"document_count_mismatch",
     [](std::string& idx, std::string&) { put_u64(idx, 26, get_u64(idx, 26) - 1); }, ".idx",
     "document_count"},
    {"huge_counts", [](std::string& idx, std::string&) { put_u64(idx, 18, uint64_t{1} << 62); },
     ".idx", "sequence_count"},
    {"negative_length",
     [](std::string& idx, std::string&) {
       const int32_t neg = -3;
       std::memcpy(idx.data() + 34 + 4 * 5, &neg, 4);
     },
     ".idx", "sequence_lengths[5]"},
    {"pointer_off_by_one",
     [](std::string& idx, std::string&) {
       const size_t at = pointers_at(idx) + 8 * 17;
       put_u64(idx, at, get_u64(idx, at) + 1);
     },
     ".idx", "sequence_pointers[17]"},
    {"documents_not_starting_at_zero",
     [](std::string& idx, std::string&) { put_u64(idx, documents_at(idx), 1); }, ".idx",
     "document_indices[0]"},
    {"documents_decreasing",
     [](std::string& idx, std::string&) {
       const size_t at = documents_at(idx) + 8 * 10;
       put_u64(idx, at, get_u64(idx, at + 8) + 1);
     },
     ".idx", "document_indices[11]"},
    {"documents_not_ending_at_sequence_count",
     [](std::string& idx, std::string&) {
       const size_t last = idx.size() - 8;
       put_u64(idx, last, get_u64(idx, last) - 1);
     },
     ".idx", "expected sequence_count"},
    {"multimodal_modes", [](std::string& idx, std::string&) { idx.append(get_u64(idx, 18), '\0'); },
     ".idx", "sequence_modes"},
    {"bin_one_byte_short", [](std::string&, std::string& bin) { bin.pop_back(); }, ".bin",
     "truncated"},
    {"bin_one_byte_long", [](std::string&, std::string& bin) { bin.push_back('\0'); }, ".bin",
     "trailing"},
    {"bin_missing", [](std::string&, std::string& bin) { bin = "\x01missing"; }, ".bin",
     "cannot open"},
};

INSTANTIATE_TEST_SUITE_P(AllKinds, CorruptionTest, ::testing::ValuesIn(kCorruptions),
                         [](const auto& p) { return std::string(p.param.name); });

TEST(IndexedDataset, MissingIndexIsNamed) {
  const std::string dir = scratch();
  try {
    IndexedDataset::open(dir + "/nothing");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/nothing.idx"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
