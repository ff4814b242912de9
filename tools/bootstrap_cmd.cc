#include "tools/bootstrap_cmd.h"

#include <fmt/format.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "kvbridge/bootstrap.h"
#include "tools/auth_flag.h"

namespace kvbridge::tools {
namespace {

struct BootstrapFlags {
  std::string host = "127.0.0.1";
  std::string auth_token_file;
  int port = 8998;
  int unresponsive_after_ms = 1000;
  int dead_after_ms = 10000;
  int threads = 1024;
};

int RunBootstrap(const BootstrapFlags& f) {
  // Signals are taken synchronously with sigwait: no work in a handler, and
  // every server thread inherits the blocked mask, so only this thread sees
  // them. A shell that started us in the background may have set SIGINT to
  // "ignore", which would drop it even while blocked; restore the default.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (int err = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); err != 0) {
    std::fputs(
        fmt::format("kvbridge bootstrap: cannot block signals: {}\n", std::strerror(err)).c_str(),
        stderr);
    return 1;
  }

  Result<std::string> token = CommandAuthToken(f.auth_token_file, "kvbridge bootstrap");
  if (!token.ok()) {
    // The message begins with "kvbridge bootstrap: " already.
    std::fputs((token.status().message() + "\n").c_str(), stderr);
    return 1;
  }
  BootstrapServerOptions o;
  o.auth_token = *token;
  o.host = f.host;
  o.port = f.port;
  o.unresponsive_after = std::chrono::milliseconds(f.unresponsive_after_ms);
  o.dead_after = std::chrono::milliseconds(f.dead_after_ms);
  o.threads = f.threads;
  Result<std::unique_ptr<BootstrapServer>> server = BootstrapServer::Start(o);
  if (!server.ok()) {
    std::fputs(fmt::format("kvbridge bootstrap: {}\n", server.status().message()).c_str(), stderr);
    return 1;
  }
  std::fputs(fmt::format("kvbridge bootstrap server listening on {} (metrics at "
                         "http://{}/metrics); Ctrl-C to stop\n",
                         (*server)->address(), (*server)->address())
                 .c_str(),
             stdout);
  std::fflush(stdout);

  int sig = 0;
  while (true) {
    int err = sigwait(&stop_signals, &sig);
    if (err == 0) break;
    if (err != EINTR) {
      std::fputs(fmt::format("kvbridge bootstrap: sigwait: {}\n", std::strerror(err)).c_str(),
                 stderr);
      break;
    }
  }
  std::fputs(fmt::format("kvbridge bootstrap: {} received, stopping\n", sig == SIGINT    ? "SIGINT"
                                                                        : sig == SIGTERM ? "SIGTERM"
                                                                                         : "error")
                 .c_str(),
             stdout);
  std::fflush(stdout);
  (*server)->Stop();
  return 0;
}

}  // namespace

void AddBootstrapCommand(CLI::App& app, std::function<int()>& run) {
  auto f = std::make_shared<BootstrapFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bootstrap", "Run the bootstrap server (rank registry, liveness, failures, /metrics)");
  cmd->add_option("--host", f->host,
                  "Address to listen on: loopback by default; this host's address on the ranks' "
                  "network, or 0.0.0.0 for every interface")
      ->capture_default_str();
  AddAuthTokenFileOption(cmd, &f->auth_token_file);
  cmd->add_option("--port", f->port, "TCP port; 0 picks a free one (printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--unresponsive-after-ms", f->unresponsive_after_ms,
                  "A rank silent this long is shown unresponsive")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--dead-after-ms", f->dead_after_ms, "... and this long, dead")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "Most connections served at once (a thread each)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->callback([&run, f] { run = [f] { return RunBootstrap(*f); }; });
}

}  // namespace kvbridge::tools
