// Lock annotations that clang's -Wthread-safety checks (the TSan build
// compiles with it as an error), and a mutex type it understands.
// Model: leveldb's port/thread_annotations.h, abseil's Mutex.
//
// std::mutex carries no capability attribute in libstdc++, so guarded state
// uses Mutex and MutexLock from here; with any other compiler the
// annotations compile to nothing.
#pragma once

#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define KVB_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KVB_THREAD_ANNOTATION_(x)
#endif

#define KVB_CAPABILITY(x) KVB_THREAD_ANNOTATION_(capability(x))
#define KVB_SCOPED_CAPABILITY KVB_THREAD_ANNOTATION_(scoped_lockable)
#define KVB_GUARDED_BY(x) KVB_THREAD_ANNOTATION_(guarded_by(x))
#define KVB_PT_GUARDED_BY(x) KVB_THREAD_ANNOTATION_(pt_guarded_by(x))
#define KVB_REQUIRES(...) KVB_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define KVB_EXCLUDES(...) KVB_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))
#define KVB_ACQUIRE(...) KVB_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define KVB_RELEASE(...) KVB_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define KVB_TRY_ACQUIRE(...) KVB_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define KVB_NO_THREAD_SAFETY_ANALYSIS KVB_THREAD_ANNOTATION_(no_thread_safety_analysis)

namespace kvbridge::internal {

// A std::mutex the analysis can see. Also BasicLockable, for
// std::condition_variable_any.
class KVB_CAPABILITY("mutex") Mutex {
 public:
  void lock() KVB_ACQUIRE() { mu_.lock(); }
  void unlock() KVB_RELEASE() { mu_.unlock(); }
  bool try_lock() KVB_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class KVB_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) KVB_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() KVB_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Waits on `cv` (releasing the mutex meanwhile) until `done` or `timeout`.
  template <typename Rep, typename Period, typename Pred>
  bool WaitFor(std::condition_variable_any& cv, std::chrono::duration<Rep, Period> timeout,
               Pred done) {
    return cv.wait_for(mu_, timeout, done);
  }

 private:
  Mutex& mu_;
};

}  // namespace kvbridge::internal
