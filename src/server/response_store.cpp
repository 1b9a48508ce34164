#include "server/response_store.h"

#include <fmt/format.h>

namespace serval::server {

void ResponseStore::put(const std::string& id, StoredResponse stored) {
  // (text that is not UTF-8, which generated text may hold, is measured as replaced)
  constexpr auto kReplace = Json::error_handler_t::replace;
  const size_t bytes = id.size() + stored.conversation.dump(-1, ' ', false, kReplace).size() +
                       stored.response.dump(-1, ' ', false, kReplace).size();
  std::lock_guard lock(mu_);
  if (auto it = stored_.find(id); it != stored_.end()) drop(it);
  if (bytes > max_bytes_) return;
  order_.push_back(id);
  stored_.emplace(id, Entry{std::move(stored), bytes, std::prev(order_.end())});
  bytes_ += bytes;
  while (stored_.size() > capacity_ || bytes_ > max_bytes_) drop(stored_.find(order_.front()));
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = stored_.find(id);
  if (it == stored_.end()) return std::nullopt;
  return it->second.stored;
}

std::string ResponseStore::not_kept_message(std::string_view id) {
  return fmt::format(
      "response '{}' not found (serval keeps the last {} stored responses within {} "
      "MiB, in memory)",
      id, kCapacity, kMaxBytes >> 20);
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = stored_.find(id);
  if (it == stored_.end()) return false;
  drop(it);
  return true;
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

void ResponseStore::drop(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  stored_.erase(it);
}

}  // namespace serval::server
