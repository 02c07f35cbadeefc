#include "tpuhal/rt/model_file.hpp"

#include <unistd.h>

#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tpuhal/error.hpp"

namespace tpuhal::rt {
namespace {

// The layout (docs/model-format.md). Little-endian throughout.
constexpr char kMagic[8] = {'T', 'P', 'U', 'H', 'A', 'L', 'M', 'F'};
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kEntryBytes = 32;
constexpr std::size_t kAlign = 64;
constexpr std::uint32_t kMaxSections = 64;
constexpr std::uint32_t kFlagOptional = 1;

// Header fields.
constexpr std::size_t kOffVersion = 8, kOffHeaderBytes = 12, kOffFileBytes = 16, kOffCount = 24, kOffTableCrc = 28,
                      kOffHeaderCrc = 60;
// Section table entry fields.
constexpr std::size_t kEntKind = 0, kEntFlags = 4, kEntOffset = 8, kEntBytes = 16, kEntCrc = 24, kEntReserved = 28;

std::uint32_t crc32(const std::byte* p, std::size_t n) {
  boost::crc_32_type crc;
  crc.process_bytes(p, n);
  return crc.checksum();
}

template <typename T>
T load(const std::byte* p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}
template <typename T>
void store(std::byte* p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

bool known(std::uint32_t kind) { return kind >= 1 && kind <= static_cast<std::uint32_t>(SectionKind::HostStage); }

std::uint64_t align_up(std::uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void corrupt(std::string_view name, const std::string& what) {
  throw Error(Status::InvalidArgument, std::string(name) + ": " + what);
}

std::string section_name(std::uint32_t kind) {
  return known(kind) ? std::string(to_string(static_cast<SectionKind>(kind)))
                     : "of unknown kind " + std::to_string(kind);
}

}  // namespace

const char* to_string(SectionKind kind) noexcept {
  switch (kind) {
    case SectionKind::Meta: return "meta";
    case SectionKind::Io: return "io";
    case SectionKind::Graph: return "graph";
    case SectionKind::Weights: return "weights";
    case SectionKind::Quant: return "quant";
    case SectionKind::Report: return "report";
    case SectionKind::Stages: return "stages";
    case SectionKind::HostStage: return "host stage";
  }
  return "unknown";
}

void ModelFile::add(SectionKind kind, std::vector<std::byte> bytes, bool optional) {
  if (!known(static_cast<std::uint32_t>(kind)))
    throw Error(Status::InvalidArgument,
                "model file: section kind " + std::to_string(static_cast<std::uint32_t>(kind)) + " does not exist");
  if (has(kind))
    throw Error(Status::InvalidArgument, std::string("model file: a ") + to_string(kind) + " section is already there");
  sections_.push_back(Section{kind, optional, std::move(bytes)});
}

bool ModelFile::has(SectionKind kind) const noexcept {
  return std::any_of(sections_.begin(), sections_.end(), [&](const Section& s) { return s.kind == kind; });
}

std::span<const std::byte> ModelFile::get(SectionKind kind) const {
  for (const auto& s : sections_)
    if (s.kind == kind) return s.bytes;
  throw Error(Status::NotFound, std::string("model file: no ") + to_string(kind) + " section");
}

std::vector<std::byte> encode(const ModelFile& model) {
  const auto& sections = model.sections();
  if (sections.size() > kMaxSections)
    throw Error(Status::InvalidArgument, "model file: " + std::to_string(sections.size()) + " sections; at most " +
                                             std::to_string(kMaxSections));
  std::uint64_t at = align_up(kHeaderBytes + kEntryBytes * sections.size());
  std::vector<std::uint64_t> offsets;
  for (const auto& s : sections) {
    offsets.push_back(at);
    at = align_up(at + s.bytes.size());
  }
  std::vector<std::byte> out(at);
  std::byte* table = out.data() + kHeaderBytes;
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const auto& s = sections[i];
    std::byte* e = table + kEntryBytes * i;
    store<std::uint32_t>(e + kEntKind, static_cast<std::uint32_t>(s.kind));
    store<std::uint32_t>(e + kEntFlags, s.optional ? kFlagOptional : 0);
    store<std::uint64_t>(e + kEntOffset, offsets[i]);
    store<std::uint64_t>(e + kEntBytes, s.bytes.size());
    store<std::uint32_t>(e + kEntCrc, crc32(s.bytes.data(), s.bytes.size()));
    if (!s.bytes.empty()) std::memcpy(out.data() + offsets[i], s.bytes.data(), s.bytes.size());
  }
  std::byte* h = out.data();
  std::memcpy(h, kMagic, sizeof kMagic);
  store<std::uint32_t>(h + kOffVersion,
                       std::max(model.has(SectionKind::HostStage) ? 3u : 2u, model.required_version()));
  store<std::uint32_t>(h + kOffHeaderBytes, kHeaderBytes);
  store<std::uint64_t>(h + kOffFileBytes, out.size());
  store<std::uint32_t>(h + kOffCount, static_cast<std::uint32_t>(sections.size()));
  store<std::uint32_t>(h + kOffTableCrc, crc32(table, kEntryBytes * sections.size()));
  store<std::uint32_t>(h + kOffHeaderCrc, crc32(h, kOffHeaderCrc));
  return out;
}

ModelFile decode(std::span<const std::byte> bytes, std::string_view name) {
  const std::byte* h = bytes.data();
  if (bytes.size() < kHeaderBytes || std::memcmp(h, kMagic, sizeof kMagic) != 0)
    corrupt(name,
            "not a compiled model (it does not start with the TPUHALMF signature; make one with "
            "`tpuhal compile`)");
  const auto version = load<std::uint32_t>(h + kOffVersion);
  if (version < kOldestModelFormatVersion || version > kModelFormatVersion)
    throw Error(Status::VersionMismatch, std::string(name) + ": written in model format version " +
                                             std::to_string(version) + ", and this tpuhal reads versions " +
                                             std::to_string(kOldestModelFormatVersion) + " to " +
                                             std::to_string(kModelFormatVersion) +
                                             ": compile the model again with this version's `tpuhal compile`");
  if (load<std::uint32_t>(h + kOffHeaderCrc) != crc32(h, kOffHeaderCrc))
    corrupt(name, "the header is damaged (checksum mismatch)");
  if (load<std::uint32_t>(h + kOffHeaderBytes) != kHeaderBytes)
    corrupt(name, "header size " + std::to_string(load<std::uint32_t>(h + kOffHeaderBytes)) + ", expected " +
                      std::to_string(kHeaderBytes));
  for (std::size_t i = kOffTableCrc + 4; i < kOffHeaderCrc; ++i)
    if (h[i] != std::byte{0}) corrupt(name, "reserved header byte " + std::to_string(i) + " is not zero");
  const auto file_bytes = load<std::uint64_t>(h + kOffFileBytes);
  if (bytes.size() < file_bytes)
    corrupt(name, "truncated: the header says " + std::to_string(file_bytes) + " bytes, there are " +
                      std::to_string(bytes.size()));
  if (bytes.size() > file_bytes)
    corrupt(name, std::to_string(bytes.size() - file_bytes) + " bytes of unexpected data after the end (" +
                      std::to_string(file_bytes) + " bytes)");
  const auto count = load<std::uint32_t>(h + kOffCount);
  if (count > kMaxSections) corrupt(name, std::to_string(count) + " sections; at most " + std::to_string(kMaxSections));
  const std::uint64_t table_end = kHeaderBytes + std::uint64_t{kEntryBytes} * count;
  if (table_end > file_bytes) corrupt(name, "the section table runs past the end of the file");
  const std::byte* table = h + kHeaderBytes;
  if (load<std::uint32_t>(h + kOffTableCrc) != crc32(table, kEntryBytes * count))
    corrupt(name, "the section table is damaged (checksum mismatch)");

  struct Entry {
    std::uint32_t kind, flags;
    std::uint64_t offset, size;
    std::uint32_t crc;
  };
  std::vector<Entry> entries;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::byte* e = table + kEntryBytes * i;
    Entry en{load<std::uint32_t>(e + kEntKind), load<std::uint32_t>(e + kEntFlags), load<std::uint64_t>(e + kEntOffset),
             load<std::uint64_t>(e + kEntBytes), load<std::uint32_t>(e + kEntCrc)};
    const std::string what = "section " + std::to_string(i) + " (" + section_name(en.kind) + ")";
    if (en.flags & ~kFlagOptional) corrupt(name, what + " has unknown flags " + std::to_string(en.flags));
    if (load<std::uint32_t>(e + kEntReserved) != 0) corrupt(name, what + ": reserved field is not zero");
    if (en.offset % kAlign != 0 || en.offset < table_end)
      corrupt(name, what + " starts at " + std::to_string(en.offset) + ", not at a 64-byte boundary after the table");
    if (en.offset > file_bytes || en.size > file_bytes - en.offset)
      corrupt(name, what + " (" + std::to_string(en.size) + " bytes at " + std::to_string(en.offset) +
                        ") runs past the end of the file (" + std::to_string(file_bytes) + " bytes)");
    for (const Entry& other : entries) {
      if (other.kind == en.kind) corrupt(name, "two " + section_name(en.kind) + " sections");
      if (en.offset < other.offset + other.size && other.offset < en.offset + en.size)
        corrupt(name, what + " overlaps the " + section_name(other.kind) + " section");
    }
    entries.push_back(en);
  }
  ModelFile model;
  model.require_version(version);  // encoded again, it keeps what its contents needed
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Entry& en = entries[i];
    if (!known(en.kind)) {
      if (en.flags & kFlagOptional) continue;  // a later format's extra, safe to skip
      corrupt(name, "section " + std::to_string(i) + " is of kind " + std::to_string(en.kind) +
                        ", which this tpuhal does not know and the file says it must");
    }
    if (en.kind == static_cast<std::uint32_t>(SectionKind::HostStage) && version < 3)
      corrupt(name, "section " + std::to_string(i) + " is a host stage, which a version " + std::to_string(version) +
                        " file cannot hold");
    const std::byte* p = h + en.offset;
    if (crc32(p, en.size) != en.crc)
      corrupt(name, "the " + section_name(en.kind) + " section is damaged (checksum mismatch)");
    model.add(static_cast<SectionKind>(en.kind), std::vector<std::byte>(p, p + en.size), en.flags & kFlagOptional);
  }
  return model;
}

namespace {

[[noreturn]] void io_error(const std::filesystem::path& path, const char* doing, int err) {
  const Status s = err == ENOENT                   ? Status::NotFound
                   : err == EACCES || err == EPERM ? Status::PermissionDenied
                                                   : Status::Unavailable;
  throw Error(s, path.string() + ": cannot " + doing + ": " + std::strerror(err));
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

ModelFile read_model_file(const std::filesystem::path& path) {
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) io_error(path, "open it", errno);
  std::vector<std::byte> bytes;
  std::byte buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) bytes.insert(bytes.end(), buf, buf + n);
  if (std::ferror(f.get())) io_error(path, "read it", errno);
  return decode(bytes, path.string());
}

void write_model_file(const std::filesystem::path& path, const ModelFile& model) {
  const auto bytes = encode(model);
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  {
    std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) io_error(path, "create it", errno);
    if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size() || std::fflush(f.get()) != 0 ||
        ::fsync(::fileno(f.get())) != 0) {
      const int err = errno;
      std::filesystem::remove(tmp);
      io_error(path, "write it", err);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    io_error(path, "write it", ec.value());
  }
}

std::string escape_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char b) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02x", b);
    out += buf;
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (b < 0x20 || b == 0x7f)
        escape(b);
      else
        out += static_cast<char>(b);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation
    // bytes; overlong forms, surrogates, code points past U+10FFFF and the
    // C1 controls are escaped byte by byte.
    const std::size_t len = b < 0xc2 ? 0 : b < 0xe0 ? 2 : b < 0xf0 ? 3 : b < 0xf5 ? 4 : 0;
    std::uint32_t cp = b & (0x7fu >> len);
    bool ok = len != 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      ok = (c & 0xc0) == 0x80;
      cp = (cp << 6) | (c & 0x3fu);
    }
    const std::uint32_t least = len == 4 ? 0x10000 : len == 3 ? 0x800 : 0xa0;
    ok = ok && cp >= least && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) {
      escape(b);
      ++i;
      continue;
    }
    out.append(text.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace tpuhal::rt
