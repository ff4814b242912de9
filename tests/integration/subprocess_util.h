// A child process for multi-process tests: spawn a program, talk to it line by
// line over its stdin/stdout, kill it, and wait for it with a deadline. And
// RunCommand, for a command that only has to run to its end (the CLI tests).
//
// Every wait takes a timeout and returns DeadlineExceeded when it runs out, so
// tests wait on conditions, never sleep. stderr is inherited (the child's logs
// show up in the test output). The destructor SIGKILLs and reaps a child that
// is still running.
//
// Thread safety: one thread per Subprocess, except that Kill() and pid() may
// be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "kvbridge/status.h"

namespace kvbridge::testing {

struct CommandOutput {
  int exit_status = -1;  // -1: it could not start or did not exit normally
  std::string out;       // stdout; stderr too where the command says 2>&1
};

// Runs `command` through the shell (popen) and waits for it to end.
CommandOutput RunCommand(const std::string& command);

class Subprocess {
 public:
  // Starts `program` with `args` (argv[1..]); `env` entries ("NAME=value") are
  // added to this process's environment. Errors: Internal (pipe/fork failed).
  // A program that cannot be executed exits with status 127.
  static Result<Subprocess> Spawn(const std::string& program, const std::vector<std::string>& args,
                                  const std::vector<std::string>& env = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // Writes `line` and a newline to the child's stdin. Unavailable when the
  // child closed it.
  Status WriteLine(std::string_view line);
  // Closes the child's stdin (it sees EOF).
  void CloseStdin();
  // The next line of the child's stdout, without the newline.
  // DeadlineExceeded after `timeout`; Unavailable at EOF.
  Result<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one starts with `prefix`; returns it (the others are
  // dropped). Same errors as ReadLine, for the whole wait.
  Result<std::string> ReadLineWithPrefix(std::string_view prefix,
                                         std::chrono::milliseconds timeout);

  // Sends `sig` (default SIGKILL). OK if the child already exited.
  Status Kill(int sig = 9);
  // Waits for the child to exit and reaps it; returns the raw wait status
  // (use WIFEXITED etc.). DeadlineExceeded after `timeout`.
  Result<int> Wait(std::chrono::milliseconds timeout);

 private:
  Subprocess() = default;
  void Reset();

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string buffer_;  // stdout bytes read but not yet returned
};

}  // namespace kvbridge::testing
