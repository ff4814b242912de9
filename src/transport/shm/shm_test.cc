#include "transport/shm/shm.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <fstream>
#include <vector>

#include "kvbridge/memory.h"

namespace kvbridge::internal {
namespace {

using ::testing::HasSubstr;

// A pipe for parent/child hand-offs; reads and writes of small PODs.
class Pipe {
 public:
  Pipe() { EXPECT_EQ(pipe(fds_), 0); }
  ~Pipe() {
    for (int fd : fds_)
      if (fd >= 0) close(fd);
  }
  template <typename T>
  bool Send(const T& v) {
    return write(fds_[1], &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
  }
  template <typename T>
  bool Receive(T* v) {
    return read(fds_[0], v, sizeof(*v)) == static_cast<ssize_t>(sizeof(*v));
  }

 private:
  int fds_[2] = {-1, -1};
};

// Waits for `pid` and returns its exit code (or 128 + signal).
int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// A pid that certainly belonged to a process that is now gone (reaped).
int DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  EXPECT_EQ(WaitExit(pid), 0);
  return pid;
}

uint8_t Pattern(size_t i) { return static_cast<uint8_t>(i * 131 + 7); }

TEST(SharedBufferTest, ZeroLengthIsInvalidArgument) {
  Result<void*> r = AllocateSharedBuffer(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(SharedBufferTest, AllocatesZeroedPagesAndFindsSegments) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Result<void*> r = AllocateSharedBuffer(page + 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto* p = static_cast<uint8_t*>(*r);
  for (size_t i = 0; i < 2 * page; ++i) ASSERT_EQ(p[i], 0) << i;  // rounded to 2 pages

  auto whole = FindSharedSegment(p, 2 * page);
  ASSERT_TRUE(whole.has_value());
  EXPECT_GE(whole->fd, 0);
  EXPECT_EQ(whole->offset, 0u);
  EXPECT_EQ(whole->segment_size, 2 * page);

  auto inner = FindSharedSegment(p + 100, 50);
  ASSERT_TRUE(inner.has_value());
  EXPECT_EQ(inner->offset, 100u);
  EXPECT_EQ(inner->fd, whole->fd);

  EXPECT_FALSE(FindSharedSegment(p + 1, 2 * page).has_value());  // runs past the end
  EXPECT_FALSE(FindSharedSegment(p + 2 * page, 1).has_value());
  std::vector<uint8_t> heap(64);
  EXPECT_FALSE(FindSharedSegment(heap.data(), heap.size()).has_value());

  EXPECT_EQ(FreeSharedBuffer(p + page).code(), StatusCode::kNotFound);  // interior pointer
  ASSERT_TRUE(FreeSharedBuffer(p).ok());
  EXPECT_FALSE(FindSharedSegment(p, 1).has_value());
  Status again = FreeSharedBuffer(p);
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_EQ(FreeSharedBuffer(heap.data()).code(), StatusCode::kNotFound);
}

TEST(SharedBufferTest, MapOwnSegmentSharesBytes) {
  Result<void*> r = AllocateSharedBuffer(8192);
  ASSERT_TRUE(r.ok());
  auto ref = FindSharedSegment(*r, 1);
  ASSERT_TRUE(ref.has_value());
  Result<MappedPeerSegment> m = MappedPeerSegment::Map(ref->fd, ref->segment_size);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size(), ref->segment_size);
  EXPECT_NE(m->data(), *r);
  m->data()[4000] = 0x5a;
  EXPECT_EQ(static_cast<uint8_t*>(*r)[4000], 0x5a);

  MappedPeerSegment moved = std::move(*m);
  EXPECT_EQ(m->data(), nullptr);
  moved.data()[1] = 3;
  EXPECT_EQ(static_cast<uint8_t*>(*r)[1], 3);
  ASSERT_TRUE(FreeSharedBuffer(*r).ok());
  moved.data()[2] = 4;  // the mapping keeps the segment alive after Free
  EXPECT_EQ(moved.data()[2], 4);
}

TEST(SharedBufferTest, MapRejectsForeignFdsAndWrongSizes) {
  Result<void*> r = AllocateSharedBuffer(8192);
  ASSERT_TRUE(r.ok());
  auto ref = FindSharedSegment(*r, 1);
  ASSERT_TRUE(ref.has_value());
  // The owner's word on the size must match the memfd.
  Result<MappedPeerSegment> wrong = MappedPeerSegment::Map(ref->fd, ref->segment_size / 2);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("owner says"));

  // An fd of this process that is not a kvbridge segment.
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  Result<MappedPeerSegment> foreign = MappedPeerSegment::Map(fd, 4096);
  close(fd);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(foreign.status().message(), HasSubstr("not a kvbridge shared segment"));

  EXPECT_EQ(MappedPeerSegment::Map(-1, 4096).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MappedPeerSegment::Map(ref->fd, 0).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(FreeSharedBuffer(*r).ok());
}

// A segment is sealed at its size: its owner cannot cut it short under a
// peer's mapping (a write there would be SIGBUS in the peer). A kvbridge-named
// memfd without the seal is refused.
TEST(SharedBufferTest, SegmentsAreSealedAndAnUnsealedOneIsRefused) {
  Result<void*> r = AllocateSharedBuffer(8192);
  ASSERT_TRUE(r.ok());
  auto ref = FindSharedSegment(*r, 1);
  ASSERT_TRUE(ref.has_value());
  EXPECT_NE(ftruncate(ref->fd, 0), 0) << "the owner could shrink its segment";
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE(MappedPeerSegment::Map(ref->fd, ref->segment_size).ok());
  ASSERT_TRUE(FreeSharedBuffer(*r).ok());

  const int fd = memfd_create("kvbridge-shm", MFD_CLOEXEC);  // the name, no seal
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  Result<MappedPeerSegment> unsealed = MappedPeerSegment::Map(fd, 8192);
  close(fd);
  ASSERT_FALSE(unsealed.ok());
  EXPECT_EQ(unsealed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unsealed.status().message(), HasSubstr("not sealed"));
}

TEST(CrossMemoryTest, WritesMoreThanIovMaxSegmentsIntoPeer) {
  // 3 * IOV_MAX scattered 24-byte segments (plus empty ones) into a child's
  // plain heap buffer; the child checks every byte, including the gaps.
  constexpr size_t kSegments = 3 * IOV_MAX + 17;
  constexpr size_t kStride = 64;
  constexpr size_t kLen = 24;
  constexpr size_t kSize = kSegments * kStride;
  Pipe to_parent;
  Pipe to_child;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::vector<uint8_t> buf(kSize, 0xee);
    uint64_t addr = reinterpret_cast<uintptr_t>(buf.data());
    if (!to_parent.Send(addr)) _exit(11);
    char go;
    if (!to_child.Receive(&go)) _exit(12);
    for (size_t i = 0; i < kSize; ++i) {
      const bool written = i % kStride < kLen;
      if (buf[i] != (written ? Pattern(i) : 0xee)) _exit(13);
    }
    _exit(0);
  }
  uint64_t remote = 0;
  ASSERT_TRUE(to_parent.Receive(&remote));
  ASSERT_TRUE(ProbeCrossMemoryAttach(child, remote).ok());
  std::vector<uint8_t> src(kSize);
  for (size_t i = 0; i < kSize; ++i) src[i] = Pattern(i);
  std::vector<CmaSegment> segs;
  for (size_t s = 0; s < kSegments; ++s) {
    segs.push_back({src.data() + s * kStride, remote + s * kStride, kLen});
    if (s % 100 == 0) segs.push_back({nullptr, 0, 0});  // empty segments are skipped
  }
  ASSERT_GT(segs.size(), static_cast<size_t>(3 * IOV_MAX));
  Status st = CrossMemoryWrite(child, segs);
  EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(to_child.Send('g'));
  EXPECT_EQ(WaitExit(child), 0) << "child saw wrong bytes";
}

TEST(CrossMemoryTest, DeadPeerIsUnavailable) {
  const int pid = DeadPid();
  uint8_t byte = 1;
  const uint64_t addr = reinterpret_cast<uintptr_t>(&byte);
  Status probe = ProbeCrossMemoryAttach(pid, addr);
  EXPECT_EQ(probe.code(), StatusCode::kUnavailable) << probe.ToString();
  EXPECT_THAT(probe.message(), HasSubstr("pid " + std::to_string(pid)));
  CmaSegment seg{&byte, addr, 1};
  Status write = CrossMemoryWrite(pid, {&seg, 1});
  EXPECT_EQ(write.code(), StatusCode::kUnavailable) << write.ToString();
  EXPECT_THAT(write.message(), HasSubstr("pid " + std::to_string(pid)));
}

TEST(CrossMemoryTest, UnmappedAddressIsInvalidArgumentNamingIt) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* mem = static_cast<uint8_t*>(
      mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(mem, MAP_FAILED);
  // The second page is a hole. PROT_NONE rather than munmap: an unmapped
  // range could be reused by the next mmap in this process (the logger, the
  // sanitizer runtime) and the write would then land there.
  ASSERT_EQ(mprotect(mem + page, page, PROT_NONE), 0);
  const uint64_t hole = reinterpret_cast<uintptr_t>(mem + page);
  char hole_hex[32];
  std::snprintf(hole_hex, sizeof(hole_hex), "0x%llx", static_cast<unsigned long long>(hole));

  Status probe = ProbeCrossMemoryAttach(getpid(), hole);
  EXPECT_EQ(probe.code(), StatusCode::kInvalidArgument) << probe.ToString();
  EXPECT_THAT(probe.message(), HasSubstr(hole_hex));

  // The first segment lands (partial write), the write resumes at the hole
  // and reports exactly that address and the pid.
  std::vector<uint8_t> src(page + 64, 0x42);
  std::vector<CmaSegment> segs = {{src.data(), reinterpret_cast<uintptr_t>(mem), 64},
                                  {src.data(), hole, 64}};
  Status st = CrossMemoryWrite(getpid(), segs);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(hole_hex));
  EXPECT_THAT(st.message(), HasSubstr("pid " + std::to_string(getpid())));
  EXPECT_EQ(mem[0], 0x42);
  EXPECT_EQ(mem[63], 0x42);
  EXPECT_EQ(mem[64], 0);

  // One segment that straddles into the hole: the first part is written,
  // the error names the first unwritten byte.
  std::vector<CmaSegment> straddle = {{src.data(), hole - 32, 64}};
  st = CrossMemoryWrite(getpid(), straddle);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(hole_hex));
  EXPECT_EQ(mem[page - 1], 0x42);
  munmap(mem, 2 * page);
}

TEST(CrossMemoryTest, UnprivilegedPeerIsPermissionDenied) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to drop to another uid";
  Result<void*> r = AllocateSharedBuffer(4096);
  ASSERT_TRUE(r.ok());
  auto ref = FindSharedSegment(*r, 1);
  ASSERT_TRUE(ref.has_value());
  const uint64_t addr = reinterpret_cast<uintptr_t>(*r);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    if (ProbeCrossMemoryAttach(getppid(), addr).code() != StatusCode::kPermissionDenied) _exit(11);
    uint8_t byte = 1;
    CmaSegment seg{&byte, addr, 1};
    if (CrossMemoryWrite(getppid(), {&seg, 1}).code() != StatusCode::kPermissionDenied) _exit(12);
    _exit(0);
  }
  const int code = WaitExit(child);
  if (code == 10) {
    ASSERT_TRUE(FreeSharedBuffer(*r).ok());
    GTEST_SKIP() << "cannot drop to uid 65534 here (no CAP_SETUID?)";
  }
  EXPECT_EQ(code, 0) << "11: probe, 12: write, 13: map was not PermissionDenied";
  EXPECT_EQ(static_cast<uint8_t*>(*r)[0], 0);
  ASSERT_TRUE(FreeSharedBuffer(*r).ok());
}

}  // namespace
}  // namespace kvbridge::internal
