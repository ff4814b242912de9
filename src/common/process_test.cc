#include "common/process.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <string>
#include <thread>

namespace kvbridge::internal {
namespace {

TEST(ProcessStateTest, TracksStopContinueAndExit) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipefd[1]);
    char c;
    while (read(pipefd[0], &c, 1) < 0) {
    }
    _exit(0);
  }
  close(pipefd[0]);
  EXPECT_EQ(GetProcessState(getpid()), ProcessState::kRunning);
  EXPECT_EQ(GetProcessState(child), ProcessState::kRunning);

  ASSERT_EQ(kill(child, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);  // returns once stopped
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(GetProcessState(child), ProcessState::kStopped);

  ASSERT_EQ(kill(child, SIGKILL), 0);
  // Not reaped yet: a zombie counts as exited.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOWAIT), 0);
  EXPECT_EQ(GetProcessState(child), ProcessState::kExited);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(GetProcessState(child), ProcessState::kExited);
  close(pipefd[1]);
}

// What the kernel shows for thread `tid` of this process (top -H, ps -L).
std::string ThreadComm(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return comm;
}

TEST(ThreadNameTest, TheKernelShowsTheNameCutTo15Characters) {
  std::string short_name, long_name;
  std::thread t([&] {
    NameThisThread("kvb-test");
    short_name = ThreadComm(static_cast<pid_t>(gettid()));
    NameThisThread("kvb-a-name-longer-than-fifteen");
    long_name = ThreadComm(static_cast<pid_t>(gettid()));
  });
  t.join();
  EXPECT_EQ(short_name, "kvb-test");
  EXPECT_EQ(long_name, "kvb-a-name-long");
}

TEST(ProcessStateTest, InvalidPidIsUnknown) {
  EXPECT_EQ(GetProcessState(0), ProcessState::kUnknown);
  EXPECT_EQ(GetProcessState(-3), ProcessState::kUnknown);
  EXPECT_NE(DescribeProcessState(ProcessState::kStopped).find("stopped"), std::string::npos);
}

}  // namespace
}  // namespace kvbridge::internal
