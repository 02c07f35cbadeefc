// The compiled-model container (tpuhal/rt/model_file.hpp): round trips, and
// every kind of damage refused with an error that says what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tpuhal/error.hpp"
#include "tpuhal/rt/model_file.hpp"

namespace tpuhal::rt {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

ModelFile sample() {
  ModelFile m;
  m.add(SectionKind::Meta, bytes_of("producer=tpuhal test\nprecision=fp32\n"));
  std::vector<std::byte> w(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<std::byte>(i * 7);
  m.add(SectionKind::Weights, std::move(w));
  m.add(SectionKind::Graph, {});
  m.add(SectionKind::Report, bytes_of("layer 1: 0.001"), /*optional=*/true);
  return m;
}

// The error `decode` throws for `bytes`.
Error error_of(const std::vector<std::byte>& bytes) {
  try {
    decode(bytes, "net.tpm");
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "decode accepted damaged bytes";
  return Error(Status::Ok, "");
}

void put32(std::vector<std::byte>& b, std::size_t at, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint32_t crc(const std::byte* p, std::size_t n) {
  boost::crc_32_type c;
  c.process_bytes(p, n);
  return c.checksum();
}
// Recomputes the header's checksum after a test edits it (to reach the
// checks behind it).
void reseal_header(std::vector<std::byte>& b) { put32(b, 60, crc(b.data(), 60)); }
void reseal_table(std::vector<std::byte>& b) {
  std::uint32_t count = 0;
  std::memcpy(&count, b.data() + 24, 4);
  put32(b, 28, crc(b.data() + 64, 32 * count));
  reseal_header(b);
}

TEST(ModelFile, RoundTripsEverySection) {
  const ModelFile m = sample();
  const auto bytes = encode(m);
  EXPECT_EQ(bytes.size() % 64, 0u);
  const ModelFile back = decode(bytes);
  ASSERT_EQ(back.sections().size(), m.sections().size());
  for (std::size_t i = 0; i < m.sections().size(); ++i) {
    EXPECT_EQ(back.sections()[i].kind, m.sections()[i].kind);
    EXPECT_EQ(back.sections()[i].optional, m.sections()[i].optional);
    EXPECT_EQ(back.sections()[i].bytes, m.sections()[i].bytes);
  }
  // Sections start at 64-byte boundaries: weights can be used in place.
  const auto w = back.get(SectionKind::Weights);
  EXPECT_EQ(w.size(), 1000u);
  EXPECT_EQ(encode(back), bytes);
}

TEST(ModelFile, GetNamesAMissingSectionAndAddRefusesDuplicates) {
  ModelFile m = sample();
  EXPECT_TRUE(m.has(SectionKind::Graph));
  EXPECT_FALSE(m.has(SectionKind::Quant));
  try {
    m.get(SectionKind::Quant);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NotFound);
    EXPECT_NE(std::string(e.what()).find("no quant section"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.add(SectionKind::Meta, {}), Error);
  EXPECT_THROW(m.add(static_cast<SectionKind>(99), {}), Error);
}

TEST(ModelFile, AnotherFormatVersionIsAVersionMismatchNamingBoth) {
  auto b = encode(sample());
  put32(b, 8, kModelFormatVersion + 1);
  reseal_header(b);
  const Error e = error_of(b);
  EXPECT_EQ(e.status(), Status::VersionMismatch);
  EXPECT_NE(
      std::string(e.what()).find("net.tpm: written in model format version " + std::to_string(kModelFormatVersion + 1) +
                                 ", and this tpuhal reads versions " + std::to_string(kOldestModelFormatVersion) +
                                 " to " + std::to_string(kModelFormatVersion)),
      std::string::npos)
      << e.what();
}

TEST(ModelFile, AFileIsWrittenInTheOldestVersionThatHoldsItsSections) {
  auto b = encode(sample());
  std::uint32_t version = 0;
  std::memcpy(&version, b.data() + 8, 4);
  EXPECT_EQ(version, 2u);  // a version-2 reader loads it
  ModelFile staged = sample();
  staged.add(SectionKind::HostStage, bytes_of("nodes"));
  b = encode(staged);
  std::memcpy(&version, b.data() + 8, 4);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(decode(b, "net.tpm").get(SectionKind::HostStage).size(), 5u);
  // A host stage in a version-2 file is damage, not a section to run.
  put32(b, 8, 2);
  reseal_header(b);
  const Error e = error_of(b);
  EXPECT_EQ(e.status(), Status::InvalidArgument);
  EXPECT_NE(std::string(e.what()).find("is a host stage, which a version 2 file cannot hold"), std::string::npos)
      << e.what();
  // What the sections hold may need more (a convolution accumulating into
  // its output: version 4), whatever their kinds need.
  ModelFile accumulating = sample();
  accumulating.require_version(4);
  accumulating.require_version(3);  // the larger stays
  b = encode(accumulating);
  std::memcpy(&version, b.data() + 8, 4);
  EXPECT_EQ(version, 4u);
  EXPECT_EQ(decode(b, "net.tpm").sections().size(), sample().sections().size());
  // A file read and written again keeps its version.
  b = encode(decode(b, "net.tpm"));
  std::memcpy(&version, b.data() + 8, 4);
  EXPECT_EQ(version, 4u);
}

TEST(ModelFile, DamageIsRefusedSayingWhat) {
  const auto good = encode(sample());
  struct Case {
    const char* name;
    std::function<void(std::vector<std::byte>&)> damage;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"not a model", [](auto& b) { b.assign(100, std::byte{'x'}); }, "not a compiled model"},
      {"too short", [](auto& b) { b.resize(10); }, "not a compiled model"},
      {"header bit flip", [](auto& b) { b[20] ^= std::byte{1}; }, "the header is damaged (checksum mismatch)"},
      {"truncated", [](auto& b) { b.resize(b.size() - 64); }, "truncated: the header says"},
      {"trailing data", [](auto& b) { b.resize(b.size() + 3); }, "3 bytes of unexpected data after the end"},
      {"table bit flip", [](auto& b) { b[64 + 8] ^= std::byte{1}; }, "the section table is damaged"},
      {"weights bit flip",
       [](auto& b) {
         std::uint64_t off = 0;
         std::memcpy(&off, b.data() + 64 + 32 + 8, 8);  // the second entry: weights
         b[off + 500] ^= std::byte{0x40};
       },
       "the weights section is damaged (checksum mismatch)"},
      {"section past the end",
       [](auto& b) {
         put32(b, 64 + 32 + 16, 1u << 30);
         reseal_table(b);
       },
       "section 1 (weights) (1073741824 bytes at"},
      {"misaligned section",
       [](auto& b) {
         put32(b, 64 + 32 + 8, 65);
         reseal_table(b);
       },
       "not at a 64-byte boundary"},
      {"overlap",
       [](auto& b) {
         std::uint32_t off = 0;
         std::memcpy(&off, b.data() + 64 + 8, 4);  // meta's offset
         put32(b, 64 + 32 + 8, off);               // weights on top of it
         reseal_table(b);
       },
       "overlaps the meta section"},
      {"unknown required kind",
       [](auto& b) {
         put32(b, 64 + 0, 77);
         reseal_table(b);
       },
       "of kind 77, which this tpuhal does not know"},
      {"too many sections",
       [](auto& b) {
         put32(b, 24, 1000);
         reseal_header(b);
       },
       "1000 sections; at most 64"},
      {"reserved header byte",
       [](auto& b) {
         b[40] = std::byte{1};
         reseal_header(b);
       },
       "reserved header byte 40"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto b = good;
    c.damage(b);
    const Error e = error_of(b);
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("net.tpm: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
  }
}

TEST(ModelFile, AnUnknownOptionalSectionIsSkipped) {
  auto b = encode(sample());
  // The report section (fourth) becomes a kind from a later format.
  put32(b, 64 + 3 * 32, 42);
  reseal_table(b);
  const ModelFile m = decode(b);
  EXPECT_EQ(m.sections().size(), 3u);
  EXPECT_FALSE(m.has(SectionKind::Report));
}

TEST(ModelFile, FilesAreWrittenWholeAndReadBack) {
  const fs::path dir = fs::temp_directory_path() / ("tpuhal-model-file-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "net.tpm";
  write_model_file(path, sample());
  EXPECT_EQ(read_model_file(path).get(SectionKind::Weights).size(), 1000u);
  // No temporary file is left beside it.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  try {
    read_model_file(dir / "missing.tpm");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NotFound);
    EXPECT_NE(std::string(e.what()).find("missing.tpm: cannot open it"), std::string::npos) << e.what();
  }
  { std::ofstream(dir / "text.tpm") << "hello"; }
  try {
    read_model_file(dir / "text.tpm");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text.tpm: not a compiled model"), std::string::npos) << e.what();
  }
  EXPECT_THROW(write_model_file(dir / "no-such-dir" / "x.tpm", sample()), Error);
  fs::remove_all(dir);
}

TEST(ModelFile, GivenTextFromAFileWhenEscapedThenControlBytesAndNonUtf8AreHexAndTheRestIsKept) {
  EXPECT_EQ(escape_text("producer=tpuhal 1.0 (conv_1/weights)"), "producer=tpuhal 1.0 (conv_1/weights)");
  EXPECT_EQ(escape_text("a\x1b[2Jb\x07\n\r\t\x7f"), "a\\x1b[2Jb\\x07\\x0a\\x0d\\x09\\x7f");
  EXPECT_EQ(escape_text(std::string_view("nul\0end", 7)), "nul\\x00end");
  // UTF-8 stays: 2-, 3- and 4-byte characters.
  EXPECT_EQ(escape_text("caf\xc3\xa9 \xe5\x8d\xb7\xe7\xa7\xaf \xf0\x9f\x99\x82"),
            "caf\xc3\xa9 \xe5\x8d\xb7\xe7\xa7\xaf \xf0\x9f\x99\x82");
  // C1 controls (CSI, as one byte or as UTF-8 U+009B), stray, cut short,
  // overlong and surrogate sequences do not.
  EXPECT_EQ(escape_text(std::string("\x9b") + "31m"), "\\x9b31m");
  EXPECT_EQ(escape_text(std::string("\xc2\x9b") + "31m"), "\\xc2\\x9b31m");
  EXPECT_EQ(escape_text("\xc3"), "\\xc3");
  EXPECT_EQ(escape_text("\xe5\x8d"), "\\xe5\\x8d");
  EXPECT_EQ(escape_text("\xc0\x9b"), "\\xc0\\x9b");
  EXPECT_EQ(escape_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(escape_text("\xf8\x88\x80\x80\x80"), "\\xf8\\x88\\x80\\x80\\x80");
}

}  // namespace
}  // namespace tpuhal::rt
