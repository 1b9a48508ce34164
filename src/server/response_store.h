// Responses the Responses API keeps (a request's `store`, true by default as OpenAI's): for
// `previous_response_id` (the next turn continues that conversation) and
// GET / DELETE /v1/responses/{id}. In memory, the most recent `capacity` within `max_bytes` (of
// their JSON text); older ones are dropped, and one larger than max_bytes is not kept.
// Thread-safe.
#pragma once
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "server/request_parser.h"

namespace serval::server {

struct StoredResponse {
  Json conversation;  // chat messages through this response's reply (its instructions left out)
  Json response;      // the response object as sent
};

class ResponseStore {
 public:
  static constexpr size_t kCapacity = 1024;  // the server's bounds
  static constexpr size_t kMaxBytes = size_t{256} << 20;

  explicit ResponseStore(size_t capacity = kCapacity, size_t max_bytes = kMaxBytes)
      : capacity_(capacity), max_bytes_(max_bytes) {}

  void put(const std::string& id, StoredResponse stored);
  std::optional<StoredResponse> get(const std::string& id) const;
  bool erase(const std::string& id);  // false when unknown
  // What a 404 for an id not kept says.
  static std::string not_kept_message(std::string_view id);
  size_t bytes() const;  // what the kept responses hold

 private:
  struct Entry {
    StoredResponse stored;
    size_t bytes;
    std::list<std::string>::iterator order;
  };
  void drop(std::unordered_map<std::string, Entry>::iterator it);  // with mu_ held

  mutable std::mutex mu_;
  std::list<std::string> order_;  // ids, oldest first
  size_t capacity_, max_bytes_;
  std::unordered_map<std::string, Entry> stored_;
  size_t bytes_ = 0;
};

}  // namespace serval::server
