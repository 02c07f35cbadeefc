// Mapping (anonymous and memfd-backed memory) and the eventfd helpers.
#include "tpuhal/base/mapping.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include "tpuhal/base/fd.h"

namespace tpuhal::base {
namespace {

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST(BaseMapping, PageSizeIsAPowerOfTwo) {
  const std::size_t page = page_size();
  ASSERT_GE(page, 4096u);
  EXPECT_EQ(page & (page - 1), 0u);
}

TEST(BaseMapping, AlignUpRoundsToTheNextMultiple) {
  EXPECT_EQ(align_up(0, 4096), 0u);
  EXPECT_EQ(align_up(1, 4096), 4096u);
  EXPECT_EQ(align_up(4096, 4096), 4096u);
  EXPECT_EQ(align_up(4097, 4096), 8192u);
  EXPECT_EQ(align_up(10, 3), 12u);  // any alignment, not just powers of two
}

TEST(BaseMapping, DefaultConstructedIsEmpty) {
  Mapping m;
  EXPECT_FALSE(m);
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.fd(), -1);
  EXPECT_FALSE(m.locked());
}

TEST(BaseMapping, AnonymousPopulatedIsPageAlignedZeroedAndWritable) {
  const std::size_t page = page_size();
  Mapping m = Mapping::anonymous(3 * page + 1, {.populate = true});
  ASSERT_TRUE(m);
  EXPECT_EQ(m.size(), 4 * page);  // rounded up to whole pages
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(m.data()) % page, 0u);
  EXPECT_EQ(m.fd(), -1);
  for (std::size_t i = 0; i < m.size(); i += 512) ASSERT_EQ(m.data()[i], std::byte{0}) << i;
  std::memset(m.data(), 0xA5, m.size());
  EXPECT_EQ(m.data()[m.size() - 1], std::byte{0xA5});
}

TEST(BaseMapping, AnonymousZeroBytesStillGivesOnePage) {
  Mapping m = Mapping::anonymous(0, {});
  ASSERT_TRUE(m);
  EXPECT_EQ(m.size(), page_size());
}

TEST(BaseMapping, AnonymousWithAllOptionsWorks) {
  Mapping m = Mapping::anonymous(1 << 20, {.populate = true, .lock = true, .noreserve = true, .huge_pages = true});
  ASSERT_TRUE(m);
  EXPECT_EQ(m.size(), 1u << 20);
  // mlock may fail under RLIMIT_MEMLOCK; either way the memory is usable.
  m.data()[12345] = std::byte{1};
  EXPECT_EQ(m.data()[12345], std::byte{1});
}

TEST(BaseMapping, AnonymousAbsurdSizeThrowsNamingTheSize) {
  try {
    (void)Mapping::anonymous(1ull << 62, {});
    FAIL() << "a 4 EiB mapping succeeded";
  } catch (const std::system_error& e) {
    EXPECT_NE(std::string(e.what()).find("4 EiB"), std::string::npos) << e.what();
  }
}

TEST(BaseMapping, MemfdIsSharedWithItsFileDescriptor) {
  const std::size_t page = page_size();
  Mapping m = Mapping::memfd("tpuhal-test", 2 * page);
  ASSERT_TRUE(m);
  ASSERT_GE(m.fd(), 0);
  EXPECT_EQ(m.size(), 2 * page);
  struct stat st {};
  ASSERT_EQ(::fstat(m.fd(), &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), 2 * page);
  EXPECT_TRUE(::fcntl(m.fd(), F_GETFD) & FD_CLOEXEC);

  // A store through the mapping is visible through the file, and back.
  std::memcpy(m.data() + page + 8, "tpuhal", 6);
  char buf[6] = {};
  ASSERT_EQ(::pread(m.fd(), buf, sizeof buf, static_cast<off_t>(page + 8)), 6);
  EXPECT_EQ(std::memcmp(buf, "tpuhal", 6), 0);
  ASSERT_EQ(::pwrite(m.fd(), "XY", 2, 0), 2);
  EXPECT_EQ(m.data()[0], std::byte{'X'});
  EXPECT_EQ(m.data()[1], std::byte{'Y'});
}

TEST(BaseMapping, MoveTransfersOwnership) {
  Mapping a = Mapping::memfd("tpuhal-move", 100);
  std::byte* data = a.data();
  const int fd = a.fd();
  Mapping b(std::move(a));
  EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(a.fd(), -1);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.fd(), fd);

  Mapping c = Mapping::anonymous(1, {});
  c = std::move(b);  // releases c's old pages
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.fd(), fd);
  EXPECT_FALSE(b);  // NOLINT(bugprone-use-after-move)
  c.data()[0] = std::byte{3};
}

TEST(BaseFd, UniqueFdResetClosesTheOldDescriptor) {
  int raw[2];
  ASSERT_EQ(::pipe(raw), 0);
  UniqueFd fd(raw[0]);
  fd.reset(raw[1]);
  EXPECT_EQ(::fcntl(raw[0], F_GETFD), -1);  // closed by reset()
  EXPECT_EQ(fd.get(), raw[1]);
  fd.reset();
  EXPECT_FALSE(fd);
  EXPECT_EQ(::fcntl(raw[1], F_GETFD), -1);
}

TEST(BaseFd, UniqueFdClosesOnDestructionButNotAfterRelease) {
  int raw[2];
  ASSERT_EQ(::pipe(raw), 0);
  {
    UniqueFd r(raw[0]);
    UniqueFd w(raw[1]);
    EXPECT_TRUE(r);
    EXPECT_EQ(r.get(), raw[0]);
    UniqueFd moved(std::move(w));
    EXPECT_FALSE(w);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(moved.get(), raw[1]);
    const int released = moved.release();
    EXPECT_EQ(released, raw[1]);
    EXPECT_FALSE(moved);
    EXPECT_NE(::fcntl(raw[1], F_GETFD), -1);  // release() did not close it
    ::close(released);
  }
  // r's destructor closed the read end.
  EXPECT_EQ(::fcntl(raw[0], F_GETFD), -1);
}

TEST(BaseFd, EventfdSignalAndDrain) {
  UniqueFd fd = make_eventfd();
  ASSERT_TRUE(fd);
  EXPECT_TRUE(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK);
  EXPECT_TRUE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC);

  EXPECT_FALSE(readable(fd.get()));
  EXPECT_EQ(eventfd_drain(fd.get()), 0u);  // non-blocking: empty reads as 0

  eventfd_signal(fd.get());
  eventfd_signal(fd.get());
  eventfd_signal(fd.get());
  EXPECT_TRUE(readable(fd.get()));
  EXPECT_EQ(eventfd_drain(fd.get()), 3u);
  EXPECT_FALSE(readable(fd.get()));
  EXPECT_EQ(eventfd_drain(fd.get()), 0u);
}

TEST(BaseFd, EventfdHelpersTolerateBadDescriptors) {
  eventfd_signal(-1);  // must not crash
  EXPECT_EQ(eventfd_drain(-1), 0u);
}

TEST(BaseMapping, MemfdSizeIsSealed) {
  const std::size_t page = page_size();
  Mapping m = Mapping::memfd("tpuhal-sealed", 2 * page, {.populate = true});
  const int seals = ::fcntl(m.fd(), F_GET_SEALS);
  ASSERT_GE(seals, 0);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  // Neither shrinking nor growing is allowed, so no mapping of it can fault.
  EXPECT_NE(::ftruncate(m.fd(), 0), 0);
  EXPECT_NE(::ftruncate(m.fd(), static_cast<off_t>(4 * page)), 0);
  m.data()[2 * page - 1] = std::byte{7};
  EXPECT_EQ(m.data()[2 * page - 1], std::byte{7});
}

}  // namespace
}  // namespace tpuhal::base
