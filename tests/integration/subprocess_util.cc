#include "tests/integration/subprocess_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/process.h"
#include "control/auth.h"

extern char** environ;

namespace {
// The processes a test starts share one deployment secret, as a real
// deployment's do (control/auth.h); set before any test runs.
[[maybe_unused]] const std::string kTestToken = kvbridge::internal::EnsureAuthTokenInEnvironment();
}  // namespace

namespace kvbridge::testing {
namespace {

using Clock = std::chrono::steady_clock;
using internal::RemainingMs;

}  // namespace

CommandOutput RunCommand(const std::string& command) {
  CommandOutput r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  int status = pclose(pipe);
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result<Subprocess> Subprocess::Spawn(const std::string& program,
                                     const std::vector<std::string>& args,
                                     const std::vector<std::string>& env) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return InternalError("pipe: " + std::string(strerror(errno)));
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return InternalError("pipe: " + std::string(strerror(errno)));
  }
  // Build argv/envp before fork: the child only calls async-signal-safe code.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& e : env) env_strings.push_back(e);
  std::vector<char*> argv{const_cast<char*>(program.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) return InternalError("fork: " + std::string(strerror(errno)));
  if (pid == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  signal(SIGPIPE, SIG_IGN);  // a dead child must not kill the test
  Subprocess p;
  p.pid_ = pid;
  p.stdin_fd_ = in[1];
  p.stdout_fd_ = out[0];
  return p;
}

Subprocess::Subprocess(Subprocess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      stdin_fd_(std::exchange(o.stdin_fd_, -1)),
      stdout_fd_(std::exchange(o.stdout_fd_, -1)),
      reaped_(std::exchange(o.reaped_, false)),
      wait_status_(o.wait_status_),
      buffer_(std::move(o.buffer_)) {}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    Reset();
    pid_ = std::exchange(o.pid_, -1);
    stdin_fd_ = std::exchange(o.stdin_fd_, -1);
    stdout_fd_ = std::exchange(o.stdout_fd_, -1);
    reaped_ = std::exchange(o.reaped_, false);
    wait_status_ = o.wait_status_;
    buffer_ = std::move(o.buffer_);
  }
  return *this;
}

Subprocess::~Subprocess() { Reset(); }

void Subprocess::Reset() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  CloseStdin();
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdout_fd_ = -1;
  pid_ = -1;
}

Status Subprocess::WriteLine(std::string_view line) {
  std::string data(line);
  data.push_back('\n');
  size_t done = 0;
  while (done < data.size()) {
    if (stdin_fd_ < 0) return UnavailableError("child stdin is closed");
    ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return UnavailableError("write to child stdin: " + std::string(strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  stdin_fd_ = -1;
}

Result<std::string> Subprocess::ReadLine(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    if (stdout_fd_ < 0) return UnavailableError("child stdout closed");
    pollfd pfd{stdout_fd_, POLLIN, 0};
    int r = poll(&pfd, 1, RemainingMs(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      return DeadlineExceededError("no line from child pid " + std::to_string(pid_) + " within " +
                                   std::to_string(timeout.count()) + " ms");
    }
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(stdout_fd_);
      stdout_fd_ = -1;
      return UnavailableError("child pid " + std::to_string(pid_) + " closed stdout");
    }
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

Result<std::string> Subprocess::ReadLineWithPrefix(std::string_view prefix,
                                                   std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto line = ReadLine(std::chrono::milliseconds(RemainingMs(deadline)));
    if (!line.ok()) return line.status();
    if (line->starts_with(prefix)) return line;
  }
}

Status Subprocess::Kill(int sig) {
  if (pid_ <= 0 || reaped_) return Status::Ok();
  if (kill(pid_, sig) != 0 && errno != ESRCH) {
    return InternalError("kill: " + std::string(strerror(errno)));
  }
  return Status::Ok();
}

Result<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (reaped_) return wait_status_;
  if (pid_ <= 0) return FailedPreconditionError("no child");
  const auto deadline = Clock::now() + timeout;
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      if (pidfd >= 0) close(pidfd);
      reaped_ = true;
      wait_status_ = status;
      return status;
    }
    int left = RemainingMs(deadline);
    if (left == 0) {
      if (pidfd >= 0) close(pidfd);
      return DeadlineExceededError("child pid " + std::to_string(pid_) + " still running after " +
                                   std::to_string(timeout.count()) + " ms");
    }
    if (pidfd >= 0) {
      pollfd pfd{pidfd, POLLIN, 0};
      poll(&pfd, 1, left);
    } else {
      // No pidfd (old kernel): re-check the exit condition every 10 ms.
      pollfd none{-1, 0, 0};
      poll(&none, 1, std::min(left, 10));
    }
  }
}

}  // namespace kvbridge::testing
