// A barrier for the lean step's own threads: spin briefly, then sleep on a futex (cpu_lean_step.cpp).
#pragma once

#include <immintrin.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace lean {

// Threads: the step makes its own (std::thread, once per call) and keeps them together with a
// barrier between phases. Not OpenMP: a step has ~180 phases, and libgomp lets an idle worker spin
// only ~1,000 rounds when the process has more OpenMP threads than cores (the engine thread's team
// beside the main thread's), so every phase paid a futex wake-up (measured: 20-25 ms per fp32 step
// instead of ~15 ms). This barrier spins up to kSpinNs, which covers a phase's imbalance on an idle
// machine, then sleeps on a futex, so a busy machine (other processes, a second engine) does not
// lose a core to a waiting thread.
constexpr long kSpinNs = 50000;

class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}
  void wait() {
    if (n_ == 1) return;
    const int gen = gen_.load(std::memory_order_seq_cst);
    if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) wake();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 1; gen_.load(std::memory_order_acquire) == gen; ++spins) {
      if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > std::chrono::nanoseconds(kSpinNs)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        while (gen_.load(std::memory_order_seq_cst) == gen) sleep(gen);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return;
      }
      _mm_pause();
    }
  }

 private:
#if defined(__linux__)
  void sleep(int gen) {
    syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAIT_PRIVATE, gen, nullptr, nullptr, 0);
  }
  void wake() { syscall(SYS_futex, reinterpret_cast<int*>(&gen_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0); }
#else
  void sleep(int) { std::this_thread::yield(); }
  void wake() {}
#endif
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
  std::atomic<int> sleepers_{0};
};

}  // namespace lean
