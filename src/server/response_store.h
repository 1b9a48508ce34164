// Responses the Responses API keeps (a request's `store`, true by default as OpenAI's): for
// `previous_response_id` (the next turn continues that conversation) and
// GET / DELETE /v1/responses/{id}. In memory, the most recent kCapacity; older ones are dropped.
// Thread-safe.
#pragma once
#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/request_parser.h"

namespace serval::server {

struct StoredResponse {
  Json conversation;  // chat messages through this response's reply (its instructions left out)
  Json response;      // the response object as sent
};

class ResponseStore {
 public:
  static constexpr size_t kCapacity = 1024;

  void put(const std::string& id, StoredResponse stored);
  std::optional<StoredResponse> get(const std::string& id) const;
  bool erase(const std::string& id);  // false when unknown

 private:
  mutable std::mutex mu_;
  std::list<std::string> order_;  // ids, oldest first
  std::unordered_map<std::string, std::pair<StoredResponse, std::list<std::string>::iterator>>
      stored_;
};

}  // namespace serval::server
