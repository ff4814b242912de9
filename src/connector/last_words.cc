#include "connector/last_words.h"

#include <atomic>
#include <csignal>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "connector/manager_impl.h"

namespace kvbridge::internal {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}
std::vector<ManagerImpl*>& Managers() {
  static std::vector<ManagerImpl*> managers;
  return managers;
}

std::terminate_handler previous_terminate = nullptr;

void Speak(const std::string& reason) {
  static std::atomic<bool> spoken{false};
  if (spoken.exchange(true)) return;
  std::unique_lock<std::mutex> lock(Mu(), std::try_to_lock);
  if (!lock.owns_lock()) return;
  for (ManagerImpl* m : Managers()) m->LastWords(reason);
}

void OnFatalSignal(int sig) {
  Speak(std::string("killed by ") + sigabbrev_np(sig) + " (" + strsignal(sig) + ")");
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void OnTerminate() {
  std::string reason = "std::terminate";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      reason += std::string(" after uncaught exception: ") + ex.what();
    } catch (...) {
      reason += " after an uncaught exception";
    }
  }
  Speak(reason);
  if (previous_terminate) previous_terminate();
  std::abort();
}

}  // namespace

void InstallLastWords(ManagerImpl* manager) {
  std::lock_guard<std::mutex> lock(Mu());
  static bool installed = false;
  if (!installed) {
    installed = true;
    for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE}) {
      struct sigaction sa {};
      sa.sa_handler = OnFatalSignal;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_RESETHAND | SA_NODEFER;
      struct sigaction old {};
      sigaction(sig, nullptr, &old);
      // Keep handlers someone else (a sanitizer, Python) installed.
      if (old.sa_handler == SIG_DFL) sigaction(sig, &sa, nullptr);
    }
    previous_terminate = std::set_terminate(OnTerminate);
  }
  Managers().push_back(manager);
}

void RemoveLastWords(ManagerImpl* manager) {
  std::lock_guard<std::mutex> lock(Mu());
  auto& v = Managers();
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (*it == manager) {
      v.erase(it);
      break;
    }
  }
}

}  // namespace kvbridge::internal
