// Delivers request outputs on a thread of its own (--async-scheduling): the engine thread hands
// each update over and goes on to schedule and run the next step while the callbacks (the
// server's detokenizing and streaming) run, so that host work stays off the GPU's critical path.
// Updates are delivered in the order they were pushed, which keeps every request's updates in
// order and its final update last.
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/engine.h"

namespace serval::runtime {

class OutputQueue {
 public:
  OutputQueue();
  // Delivers everything still queued, then stops the thread.
  ~OutputQueue();
  OutputQueue(const OutputQueue&) = delete;
  OutputQueue& operator=(const OutputQueue&) = delete;

  // Queues callback(output). The callback object is shared: the request may end before its
  // updates are delivered.
  void push(std::shared_ptr<const OutputCallback> callback, RequestOutput output);
  // Returns once every update pushed before the call has been delivered.
  void drain();

 private:
  struct Item {
    std::shared_ptr<const OutputCallback> callback;
    RequestOutput output;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;       // new items or stop
  std::condition_variable idle_cv_;  // the queue ran empty
  std::deque<Item> items_;
  bool delivering_ = false;  // an item is out of the queue but not yet delivered
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace serval::runtime
