// Damages JSON documents for the load-fuzz tests: replaces, removes or adds one node reached by
// a random walk from the root, with values of the wrong type, huge or negative numbers, empty
// containers or strings drawn from the caller's samples.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace serval::testing {

class JsonMutator {
 public:
  // `strings`: string values worth trying; `keys`: names of keys to add to objects. Neither empty.
  JsonMutator(uint32_t seed, std::vector<std::string> strings, std::vector<std::string> keys)
      : rng_(seed), strings_(std::move(strings)), keys_(std::move(keys)) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  nlohmann::json value() {
    using nlohmann::json;
    switch (pick(10)) {
      case 0:
        return nullptr;
      case 1:
        return pick(2) == 1;
      case 2:
        return int64_t(pick(600)) - 50;
      case 3:
        return int64_t(1) << (10 + pick(53));  // 2^10 … 2^62
      case 4:
        return -1.5;
      case 5:
        return "";
      case 6:
        return strings_[pick(strings_.size())];
      case 7:
        return json::array();
      case 8:
        return json::object();
      default:
        return json::array({strings_[pick(strings_.size())], int64_t(pick(600))});
    }
  }

  void mutate(nlohmann::json& root) {
    nlohmann::json* node = &root;
    for (int depth = 0; depth < 6; ++depth) {
      if (!(node->is_object() || node->is_array()) || node->empty() || pick(3) == 0) break;
      auto it = node->begin();
      std::advance(it, pick(std::min<size_t>(node->size(), 64)));
      nlohmann::json& child = *it;
      if (!(child.is_object() || child.is_array()) || pick(4) == 0) {
        if (node->is_object() && pick(5) == 0) {
          node->erase(it);
        } else {
          child = value();
        }
        return;
      }
      node = &child;
    }
    if (node->is_object())
      (*node)[keys_[pick(keys_.size())]] = value();
    else
      *node = value();
  }

 private:
  std::mt19937 rng_;
  std::vector<std::string> strings_, keys_;
};

}  // namespace serval::testing
