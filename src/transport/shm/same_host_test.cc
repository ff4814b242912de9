#include "transport/shm/same_host.h"

#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "kvbridge/memory.h"

namespace kvbridge::internal {
namespace {

using ::testing::HasSubstr;
constexpr std::chrono::milliseconds kTimeout{2000};

RegionToken TokenOf(uint8_t seed) {
  RegionToken t;
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(seed + i);
  return t;
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// An exporter with one shared segment (region 1) and one heap region (2).
class SameHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto e = SameHostExporter::Start();
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    exporter_ = std::move(*e);
    auto shared = AllocateSharedBuffer(2 * 4096);
    ASSERT_TRUE(shared.ok());
    shared_ = static_cast<uint8_t*>(*shared);
    // The region starts one page into its segment.
    shm_region_ = {1, TokenOf(1), Base(shared_ + 4096), 4096,
                   FindSharedSegment(shared_ + 4096, 4096)};
    ASSERT_TRUE(shm_region_.segment.has_value());
    heap_.assign(4096, 0);
    heap_region_ = {2, TokenOf(2), Base(heap_.data()), heap_.size(), std::nullopt};
    ASSERT_TRUE(exporter_->Add(shm_region_).ok());
    ASSERT_TRUE(exporter_->Add(heap_region_).ok());
  }
  void TearDown() override {
    exporter_.reset();
    if (shared_ != nullptr) {
      EXPECT_TRUE(FreeSharedBuffer(shared_).ok());
    }
  }
  static uint64_t Base(const void* p) { return reinterpret_cast<uint64_t>(p); }
  Result<SameHostGrant> Ask(const ExportedRegion& r, int pid = getpid()) {
    return RequestSameHostGrant(exporter_->name(), pid, r.region_id, r.token, r.base, r.length,
                                kTimeout);
  }

  std::unique_ptr<SameHostExporter> exporter_;
  uint8_t* shared_ = nullptr;
  std::vector<uint8_t> heap_;
  ExportedRegion shm_region_, heap_region_;
};

TEST_F(SameHostTest, GrantsTheOwnersSegmentByFdAndTheKernelsPid) {
  auto grant = Ask(shm_region_);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->pid, getpid());
  ASSERT_TRUE(grant->segment.has_value());
  EXPECT_EQ(grant->segment->size(), 2 * 4096u);
  EXPECT_EQ(grant->segment_offset, 4096u);
  // The mapping is the owner's memory, not a copy.
  grant->segment->data()[grant->segment_offset + 7] = 0x5a;
  EXPECT_EQ(shared_[4096 + 7], 0x5a);

  auto cma = Ask(heap_region_);
  ASSERT_TRUE(cma.ok()) << cma.status().ToString();
  EXPECT_EQ(cma->pid, getpid());
  EXPECT_FALSE(cma->segment.has_value());
}

TEST_F(SameHostTest, WrongTokenOrUnknownRegionIsRefusedWithoutAnFd) {
  const int fds = OpenFds();
  ExportedRegion wrong = shm_region_;
  wrong.token.bytes[15] ^= 1;
  auto refused = Ask(wrong);
  EXPECT_EQ(refused.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("no region with that id and token"));
  // Region 2's token does not open region 1, and an unknown id looks the
  // same as a wrong token.
  ExportedRegion swapped = shm_region_;
  swapped.token = heap_region_.token;
  EXPECT_EQ(Ask(swapped).status().code(), StatusCode::kPermissionDenied);
  ExportedRegion unknown = shm_region_;
  unknown.region_id = 99;
  EXPECT_EQ(Ask(unknown).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(exporter_->refused(), 3u);
  // Removed regions are no longer granted.
  exporter_->Remove(1);
  EXPECT_EQ(Ask(shm_region_).status().code(), StatusCode::kPermissionDenied);
  // Barrier: stopping the exporter joins its thread, which has closed its
  // side of every connection. What is left over is exactly the exporter's
  // own socket, its stop eventfd and its dup of the memfd: no fd came to
  // us with a refusal.
  exporter_.reset();
  EXPECT_EQ(OpenFds(), fds - 3);
}

// A per-peer grant's token opens its region (fd included) until the grant
// is revoked; it opens no other region, another grant's revoke leaves it
// be, and the number of live grants per region is bounded.
TEST_F(SameHostTest, AGrantsTokenOpensItsRegionUntilRevoked) {
  ASSERT_TRUE(exporter_->AddGrant(1, 7, TokenOf(70)).ok());
  ASSERT_TRUE(exporter_->AddGrant(1, 8, TokenOf(80)).ok());
  ExportedRegion by7 = shm_region_, by8 = shm_region_;
  by7.token = TokenOf(70);
  by8.token = TokenOf(80);
  auto granted = Ask(by7);
  ASSERT_TRUE(granted.ok()) << granted.status().ToString();
  ASSERT_TRUE(granted->segment.has_value());
  EXPECT_EQ(granted->segment_offset, 4096u);
  ExportedRegion elsewhere = heap_region_;  // grant 7 is of region 1 only
  elsewhere.token = TokenOf(70);
  EXPECT_EQ(Ask(elsewhere).status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(exporter_->AddGrant(99, 9, TokenOf(90)).code(), StatusCode::kNotFound);

  exporter_->RevokeGrant(7);
  auto revoked = Ask(by7);
  EXPECT_EQ(revoked.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(revoked.status().message(), HasSubstr("no region with that id and token"));
  EXPECT_TRUE(Ask(by8).ok());          // another peer's grant stands
  EXPECT_TRUE(Ask(shm_region_).ok());  // and so does the region's own token
  EXPECT_EQ(exporter_->refused(), 2u);

  for (uint64_t g = 100; g < 100 + SameHostExporter::kMaxGrantsPerRegion; ++g) {
    ASSERT_TRUE(exporter_->AddGrant(2, g, TokenOf(static_cast<uint8_t>(g))).ok()) << g;
  }
  Status over = exporter_->AddGrant(2, 1 << 20, TokenOf(3));
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), HasSubstr("kMaxGrantsPerRegion"));
  exporter_->RevokeGrant(100);  // a slot freed is a slot to take
  EXPECT_TRUE(exporter_->AddGrant(2, 1 << 20, TokenOf(3)).ok());
}

TEST_F(SameHostTest, DescriptorNamingAnotherPidOrAddressIsRefused) {
  // The descriptor claims the region belongs to another process: the kernel
  // says the socket is ours, so nothing is granted.
  auto other_pid = Ask(heap_region_, getpid() + 1);
  EXPECT_EQ(other_pid.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(other_pid.status().message(), HasSubstr("not by the declared owner pid"));
  // Right token, but another address or length than the owner registered.
  ExportedRegion moved = heap_region_;
  moved.base += 4096;
  auto at = Ask(moved);
  EXPECT_EQ(at.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(at.status().message(), HasSubstr("is not the declared one"));
  ExportedRegion longer = shm_region_;
  longer.length *= 2;
  EXPECT_EQ(Ask(longer).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SameHostTest, NoSuchSocketIsUnavailableAndHostileNamesAreRefused) {
  EXPECT_EQ(RequestSameHostGrant("kvbridge-no-such-socket", getpid(), 1, TokenOf(1), 1, 1, kTimeout)
                .status()
                .code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(RequestSameHostGrant(std::string(200, 'x'), getpid(), 1, TokenOf(1), 1, 1, kTimeout)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(RequestSameHostGrant("", getpid(), 1, TokenOf(1), 1, 1, kTimeout).status().code(),
            StatusCode::kInvalidArgument);
}

int RawConnect(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0) << std::strerror(errno);
  return fd;
}

TEST_F(SameHostTest, GarbledRequestsAreAnsweredAndTheExporterStaysUp) {
  for (const std::string& junk : {std::string("x"), std::string(4000, '\xff')}) {
    const int fd = RawConnect(exporter_->name());
    ASSERT_EQ(send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    char buf[512];
    // Barrier: the exporter answered (or closed) this connection.
    EXPECT_GE(recv(fd, buf, sizeof(buf), 0), 0);
    close(fd);
  }
  // A client that connects and says nothing is dropped after the timeout;
  // meanwhile the exporter still serves (after it).
  const int silent = RawConnect(exporter_->name());
  auto grant = Ask(shm_region_);
  EXPECT_TRUE(grant.ok()) << grant.status().ToString();
  close(silent);
  EXPECT_GE(exporter_->refused(), 2u);
}

// A socket held by another process: it answers every request with garbage
// and a stray fd.
TEST(SameHostForgedOwnerTest, SocketOfAnotherProcessIsNotBelieved) {
  const std::string name = "kvbridge-test-forger-" + std::to_string(getpid());
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int l = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (bind(l, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(l, 4) != 0) _exit(10);
    if (write(ready[1], "r", 1) != 1) _exit(11);
    for (int i = 0; i < 2; ++i) {
      int c = accept(l, nullptr, nullptr);
      char buf[512];
      if (recv(c, buf, sizeof(buf), 0) < 0) continue;  // the first one never asks
      int stray = open("/dev/null", O_RDONLY);
      iovec iov{const_cast<char*>("garbage"), 7};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cm), &stray, sizeof(int));
      sendmsg(c, &msg, 0);
      close(c);
    }
    _exit(0);
  }
  char r;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  close(ready[0]);
  close(ready[1]);
  const int fds = OpenFds();
  // Declared as this process: the kernel names the child, refused before a
  // request is even sent.
  auto as_us = RequestSameHostGrant(name, getpid(), 1, TokenOf(1), 4096, 4096, kTimeout);
  EXPECT_EQ(as_us.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(as_us.status().message(), HasSubstr("held by pid " + std::to_string(child)));
  // Declared as the child: its garbage answer is refused and its fd closed.
  auto as_child = RequestSameHostGrant(name, child, 1, TokenOf(1), 4096, 4096, kTimeout);
  EXPECT_EQ(as_child.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(as_child.status().message(), HasSubstr("garbled answer"));
  EXPECT_EQ(OpenFds(), fds);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace kvbridge::internal
