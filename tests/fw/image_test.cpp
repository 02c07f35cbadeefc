// Firmware images (fw/image.h): what build_image writes decodes back, and
// every way an image can be wrong is refused with a sentence naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "tpuhal/fw/image.h"

namespace tpuhal::fw {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> bytes_of(std::string_view s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

ImageSpec spec() {
  ImageSpec s;
  s.board_id = 1684;
  s.firmware_version = 1u << 24 | 2u << 16 | 3;
  s.iface_min = {1, 0};
  s.iface_max = {1, 2};
  s.sections = {{SectionKind::kCode, 0x0, bytes_of("instructions for the controller")},
                {SectionKind::kData, 0x10000, bytes_of("initialised data")},
                {SectionKind::kConfig, 0x20000, bytes_of("{\"ddr\": 3200}")}};
  return s;
}

template <class T>
T read(const std::vector<std::byte>& v, std::size_t at) {
  T x;
  std::memcpy(&x, v.data() + at, sizeof x);
  return x;
}
template <class T>
void write(std::vector<std::byte>& v, std::size_t at, T x) {
  std::memcpy(v.data() + at, &x, sizeof x);
}

// Rewrites the checksum after an edit, so that the check under test is the
// one that fires.
void reseal(std::vector<std::byte>& v) {
  write<std::uint32_t>(v, offsetof(ImageHeader, crc32c), 0);
  write<std::uint32_t>(v, offsetof(ImageHeader, crc32c), crc32c(v));
}

std::size_t entry(std::size_t i) { return sizeof(ImageHeader) + i * sizeof(SectionEntry); }

std::string problem_of(const std::vector<std::byte>& v) {
  auto r = decode_image(v);
  EXPECT_FALSE(r.ok());
  return r ? "" : describe_image_problem(r.problem());
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  // The CRC-32C check value of "123456789" (RFC 3720, iSCSI).
  EXPECT_EQ(crc32c(bytes_of("123456789")), 0xE3069283u);
  const auto whole = bytes_of("split anywhere gives the same crc");
  EXPECT_EQ(crc32c(std::span(whole).subspan(7), crc32c(std::span(whole).first(7))), crc32c(whole));
}

TEST(Image, WhatBuildImageWritesDecodesToTheSameSections) {
  const auto image = build_image(spec());
  auto r = decode_image(image);
  ASSERT_TRUE(r.ok()) << describe_image_problem(r.problem());
  EXPECT_EQ(r->board_id, 1684u);
  EXPECT_EQ(r->firmware_version, (1u << 24 | 2u << 16 | 3));
  EXPECT_EQ(r->iface_max, (Version{1, 2}));
  ASSERT_EQ(r->sections.size(), 3u);
  const auto want = spec();
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->sections[i].kind, want.sections[i].kind);
    EXPECT_EQ(r->sections[i].load_address, want.sections[i].load_address);
    ASSERT_EQ(r->sections[i].payload.size(), want.sections[i].payload.size());
    EXPECT_EQ(
        std::memcmp(r->sections[i].payload.data(), want.sections[i].payload.data(), want.sections[i].payload.size()),
        0);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r->sections[i].payload.data()) -
                  reinterpret_cast<std::uintptr_t>(image.data()),
              read<std::uint64_t>(image, entry(i) + offsetof(SectionEntry, offset)));
  }
  EXPECT_STREQ(to_string(SectionKind::kConfig), "config");
}

TEST(Image, EveryFlippedByteIsCaught) {
  const auto image = build_image(spec());
  for (std::size_t i = 0; i < image.size(); ++i) {
    auto v = image;
    v[i] ^= std::byte{0x20};
    EXPECT_FALSE(decode_image(v).ok()) << "byte " << i;
  }
}

TEST(Image, TruncatedAndPaddedImagesAreRefused) {
  const auto image = build_image(spec());
  EXPECT_THAT(problem_of({image.begin(), image.begin() + 10}), HasSubstr("10 bytes, fewer than its 64-byte header"));
  EXPECT_THAT(problem_of({image.begin(), image.end() - 16}),
              HasSubstr("says it is " + std::to_string(image.size()) + " bytes but " +
                        std::to_string(image.size() - 16) + " were given"));
  auto padded = image;
  padded.resize(image.size() + 16);
  EXPECT_THAT(problem_of(padded), HasSubstr("were given"));
}

TEST(Image, HeaderFieldsAreChecked) {
  auto v = build_image(spec());
  write<std::uint32_t>(v, 0, 0x464C457F);  // an ELF file
  EXPECT_THAT(problem_of(v), HasSubstr("not a firmware image"));
  v = build_image(spec());
  write<std::uint16_t>(v, offsetof(ImageHeader, format), 2);
  EXPECT_THAT(problem_of(v), HasSubstr("format 2 is not the format 1"));
  v = build_image(spec());
  write<std::uint32_t>(v, offsetof(ImageHeader, flags), 4);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("flags 0x4; must be 0"));
  v = build_image(spec());
  write<std::uint32_t>(v, offsetof(ImageHeader, reserved) + 8, 9);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("reserved header word is 0x9"));
  v = build_image(spec());
  write<std::uint32_t>(v, offsetof(ImageHeader, section_count), 0);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("0 sections; 1 to 16 allowed"));
  write<std::uint32_t>(v, offsetof(ImageHeader, section_count), 17);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("17 sections"));
  // A small image claiming more sections than its bytes can hold.
  ImageSpec one = spec();
  one.sections.resize(1);
  v = build_image(one);
  write<std::uint32_t>(v, offsetof(ImageHeader, section_count), 16);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section table ends at byte 576, past the image's " + std::to_string(v.size())));
}

TEST(Image, SectionEntriesAreChecked) {
  auto v = build_image(spec());
  write<std::uint32_t>(v, entry(1) + offsetof(SectionEntry, kind), 7);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 1: kind 7 is not code (1), data (2) or config (3)"));

  v = build_image(spec());
  const auto off = read<std::uint64_t>(v, entry(2) + offsetof(SectionEntry, offset));
  write<std::uint64_t>(v, entry(2) + offsetof(SectionEntry, offset), off + 1);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 2: offset " + ([&] {
                                         char b[24];
                                         std::snprintf(b, sizeof b, "%#llx", static_cast<unsigned long long>(off + 1));
                                         return std::string(b);
                                       })() +
                                       " is not 16-byte aligned"));

  v = build_image(spec());
  write<std::uint64_t>(v, entry(0) + offsetof(SectionEntry, offset), 0x40);  // inside the table
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 0: offset 0x40 is outside the payload area"));

  v = build_image(spec());
  write<std::uint64_t>(v, entry(2) + offsetof(SectionEntry, bytes), 1 << 20);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 2: 1048576 bytes run past the image's end"));

  v = build_image(spec());
  write<std::uint64_t>(v, entry(0) + offsetof(SectionEntry, bytes), 0);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 0: it is empty"));

  v = build_image(spec());
  write<std::uint64_t>(v, entry(1) + offsetof(SectionEntry, load_address), ~0ull - 4);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("section 1: load address 0xfffffffffffffffb plus its size wraps around"));
}

TEST(Image, OverlapsInTheImageAndInMemoryAreRefused) {
  auto v = build_image(spec());
  write<std::uint64_t>(v, entry(2) + offsetof(SectionEntry, offset),
                       read<std::uint64_t>(v, entry(1) + offsetof(SectionEntry, offset)));
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("sections 1 and 2 overlap in the image"));
  v = build_image(spec());
  write<std::uint64_t>(v, entry(2) + offsetof(SectionEntry, load_address), 0x8);
  reseal(v);
  EXPECT_THAT(problem_of(v), HasSubstr("sections 0 and 2 load at overlapping addresses"));
}

TEST(Image, ADamagedPayloadFailsTheChecksum) {
  auto v = build_image(spec());
  v.back() ^= std::byte{1};
  EXPECT_THAT(problem_of(v), HasSubstr("does not match its contents"));
  EXPECT_THAT(problem_of(v), HasSubstr("damaged in transit or on disk"));
}

TEST(Image, TheBoardAndInterfaceMustMatch) {
  const auto v = build_image(spec());
  EXPECT_TRUE(check_image_for(decode_image(v), 1684, {1, 2}).ok());
  EXPECT_TRUE(check_image_for(decode_image(v), 1684, {1, 0}).ok());
  auto r = check_image_for(decode_image(v), 1688, {1, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(describe_image_problem(r.problem()), "firmware image: built for board 1684, this board is 1688");
  r = check_image_for(decode_image(v), 1684, {1, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(describe_image_problem(r.problem()),
            "firmware image: implements interface 1.0 to 1.2, the driver speaks 1.3");
  r = check_image_for(decode_image(v), 1684, {2, 0});
  EXPECT_FALSE(r.ok());
  // A bad image stays the problem reported.
  auto bad = v;
  bad[0] = std::byte{0};
  r = check_image_for(decode_image(bad), 1684, {1, 2});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.problem().field, kFieldImageMagic);
}

}  // namespace
}  // namespace tpuhal::fw
