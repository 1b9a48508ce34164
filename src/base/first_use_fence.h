// A fence around driver calls that may wait for the GPUs to drain: the first launch of a kernel
// that a library loads lazily, or a kernel attribute set at a kernel's first launch. Loading takes
// a driver lock and waits for the GPUs to drain; a GPU spinning in a collective for a peer whose
// thread is blocked behind that lock never does. The tensor-parallel rank threads of one process
// install one each (runtime/parallel_runner.cpp): before() drains the rank's GPU and waits for
// every rank, after() waits until every rank is past the call, so no collective is in flight
// meanwhile. Every rank meets the same first uses, since the ranks run the same shapes.
#pragma once

namespace serval {

class FirstUseFence {
 public:
  virtual ~FirstUseFence() = default;
  virtual void before() = 0;
  virtual void after() = 0;
};

// The calling thread's fence (null: none, the default).
inline FirstUseFence*& thread_first_use_fence() {
  thread_local FirstUseFence* fence = nullptr;
  return fence;
}

}  // namespace serval
