#include "common/host_identity.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace kvbridge::internal {
namespace {

int ExitCodeOf(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// `h` as a machine of the same name would be: another boot id.
HostIdentity OnAnotherMachineOfTheSameName(HostIdentity h) {
  h.boot_id[0] = h.boot_id[0] == 'a' ? 'b' : 'a';
  return h;
}

TEST(HostIdentityTest, NamesThisHostAndFollowsFork) {
  const HostIdentity& me = ThisHost();
  EXPECT_FALSE(me.host.empty());
  ASSERT_EQ(KernelBootId(me.boot_id).size(), 36u) << me.boot_id;
  if (access("/proc/self/ns/pid", F_OK) == 0)  // else the kernel's alone
    EXPECT_NE(me.boot_id.find("/pid:["), std::string::npos) << me.boot_id;
  EXPECT_EQ(me.pid, getpid());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(ThisHost().pid == getpid() ? 0 : 1);
  EXPECT_EQ(ExitCodeOf(child), 0) << "ThisHost().pid is stale in a forked child";
}

// Containers with the host's network share its name and kernel boot id, not
// its PID namespace: a pid and /proc mean nothing across them (a stopped
// peer there was reported as exited). A process in another PID namespace is
// on another host to kvbridge. Needs root (CLONE_NEWPID): skipped without.
TEST(HostIdentityTest, AnotherPidNamespaceOfThisMachineIsAnotherHost) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    if (unshare(CLONE_NEWPID) != 0) _exit(77);
    pid_t inner = fork();  // the first process of the new namespace
    if (inner == 0) {
      const std::string b = ReadThisHost().boot_id;
      _exit(write(fds[1], b.data(), b.size()) == static_cast<ssize_t>(b.size()) ? 0 : 1);
    }
    _exit(ExitCodeOf(inner));
  }
  close(fds[1]);
  char buf[128] = {};
  const ssize_t n = read(fds[0], buf, sizeof(buf));
  close(fds[0]);
  const int code = ExitCodeOf(child);
  if (code == 77) GTEST_SKIP() << "unshare(CLONE_NEWPID) not permitted (needs root)";
  ASSERT_EQ(code, 0);
  ASSERT_GT(n, 0);
  HostIdentity there = ThisHost();
  there.boot_id.assign(buf, static_cast<size_t>(n));
  EXPECT_EQ(KernelBootId(there.boot_id), KernelBootId(ThisHost().boot_id));
  EXPECT_NE(there.boot_id, ThisHost().boot_id);
  EXPECT_FALSE(SameHost(ThisHost(), there));
}

TEST(HostIdentityTest, SameHostNeedsTheNameAndAKnownBootIdToMatch) {
  const HostIdentity me = ThisHost();
  ASSERT_FALSE(me.boot_id.empty());
  EXPECT_TRUE(SameHost(me, me));
  HostIdentity other = me;
  other.pid += 1;
  EXPECT_TRUE(SameHost(me, other)) << "another process on this host";
  EXPECT_FALSE(SameHost(me, OnAnotherMachineOfTheSameName(me)));
  other = me;
  other.host += "-x";  // a network namespace host: same kernel, its own name
  EXPECT_FALSE(SameHost(me, other));
  // A rank that did not say its boot id (registered through sglang's
  // protocol) is never taken for this host, even by its name.
  HostIdentity a{.host = "h", .boot_id = "", .pid = 1};
  HostIdentity b = a;
  b.pid = 2;
  EXPECT_FALSE(SameHost(a, b));
  EXPECT_FALSE(SameHost(me, HostIdentity{.host = me.host, .boot_id = "", .pid = me.pid}));
}

TEST(HostIdentityTest, SameProcessComparesHostBootIdAndPid) {
  const HostIdentity me = ThisHost();
  ASSERT_FALSE(me.boot_id.empty());
  EXPECT_TRUE(SameProcess(me, me));
  HostIdentity other = me;
  other.pid += 1;
  EXPECT_FALSE(SameProcess(me, other));
  EXPECT_FALSE(SameProcess(me, OnAnotherMachineOfTheSameName(me)))
      << "the same pid on another machine of the same name";
  // Both unknown: the declared process is the same.
  HostIdentity a{.host = "h", .boot_id = "", .pid = 7};
  EXPECT_TRUE(SameProcess(a, a));
}

// What a rank advertises and what peers read back (rank_ip): addresses and
// host names pass; what would make a URL or a connect name something else
// fails with the field and the value in the message.
TEST(HostAddressTest, TakesAddressesAndHostNamesAndRefusesTheRest) {
  for (const char* good : {"127.0.0.1", "10.9.9.9", "::1", "fe80::1", "2001:db8::42", "node-a",
                           "prefill-0.cluster.local", "h1"})
    EXPECT_TRUE(CheckHostAddress("rank_ip", good).ok()) << good;
  const std::string long_label(64, 'a');
  const std::string too_long =
      std::string(250, 'a').insert(60, ".").insert(120, ".").insert(180, ".");
  for (const std::string& bad :
       {std::string(), std::string("a b"), std::string("evil.example/x"), std::string("user@host"),
        std::string("10.0.0.1:8998"), std::string("[::1]"), std::string("host\nX-Injected: 1"),
        std::string("a..b"), std::string(".a"), std::string("-a.b"), std::string("a-.b"),
        long_label, too_long, std::string("a\0b", 3), std::string("h\xc3\xa9")}) {
    Status st = CheckHostAddress("rank_ip", bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("rank_ip"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace kvbridge::internal
