#include "server/response_store.h"

namespace serval::server {

void ResponseStore::put(const std::string& id, StoredResponse stored) {
  std::lock_guard lock(mu_);
  if (auto it = stored_.find(id); it != stored_.end()) {
    order_.erase(it->second.second);
    stored_.erase(it);
  }
  order_.push_back(id);
  stored_.emplace(id, std::pair(std::move(stored), std::prev(order_.end())));
  if (stored_.size() > kCapacity) {
    stored_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard lock(mu_);
  auto it = stored_.find(id);
  if (it == stored_.end()) return std::nullopt;
  return it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = stored_.find(id);
  if (it == stored_.end()) return false;
  order_.erase(it->second.second);
  stored_.erase(it);
  return true;
}

}  // namespace serval::server
