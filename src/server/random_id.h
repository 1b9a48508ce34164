// Identifiers of responses, messages and tool calls: a prefix and 128 random bits in hex.
#pragma once
#include <fmt/format.h>

#include <random>
#include <string>

namespace serval::server {

inline std::mt19937_64& id_rng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

inline std::string random_id(const char* prefix) {
  return fmt::format("{}{:016x}{:016x}", prefix, id_rng()(), id_rng()());
}

// `length` random letters and digits (Mistral's tool call ids are 9 of them).
inline std::string random_alnum_id(size_t length) {
  static constexpr char kAlphabet[] =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::uniform_int_distribution<size_t> pick(0, sizeof kAlphabet - 2);
  std::string id(length, ' ');
  for (char& c : id) c = kAlphabet[pick(id_rng())];
  return id;
}

}  // namespace serval::server
