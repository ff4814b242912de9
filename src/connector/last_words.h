// Last words: when the process dies on a fatal signal (SIGSEGV, SIGBUS,
// SIGABRT, SIGFPE) or std::terminate, every live manager tells its peers and
// the registry who died and why, best effort, before the default action runs.
// This is not async-signal-safe by nature (it sends messages); it only runs
// when the process is lost anyway.
#pragma once

namespace kvbridge::internal {

class ManagerImpl;

void InstallLastWords(ManagerImpl* manager);
void RemoveLastWords(ManagerImpl* manager);

}  // namespace kvbridge::internal
