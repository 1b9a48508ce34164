#include "dist/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "base/math.h"

namespace serval::dist {
namespace {

// Shard r of n equal parts of [0, total): total % n == 0 is checked by the caller.
Range even_part(int64_t total, int r, int n) {
  return {total / n * r, total / n * (r + 1)};
}

Range scaled(Range r, int64_t factor) {
  return {r.begin * factor, r.end * factor};
}

}  // namespace

void validate(const TpLayout& tp) {
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size)
    throw InvalidArgument(
        fmt::format("tensor-parallel rank {} of size {}: need size >= 1 and 0 <= rank < size",
                    tp.rank, tp.size));
}

AttentionShard shard_attention(const TpLayout& tp, int num_heads, int num_kv_heads, int head_dim) {
  validate(tp);
  if (num_heads < 1 || num_kv_heads < 1 || head_dim < 1)
    throw InvalidArgument(
        fmt::format("attention: num_heads {}, num_kv_heads {}, head_dim {} "
                    "must all be positive",
                    num_heads, num_kv_heads, head_dim));
  if (num_heads % num_kv_heads != 0)
    throw InvalidArgument(
        fmt::format("attention: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                    num_heads, num_kv_heads));
  if (num_heads % tp.size != 0)
    throw InvalidArgument(fmt::format(
        "--tensor-parallel-size {} does not divide num_attention_heads {}", tp.size, num_heads));
  AttentionShard s;
  s.q_per_kv = num_heads / num_kv_heads;
  s.q_heads = even_part(num_heads, tp.rank, tp.size);
  if (num_kv_heads >= tp.size) {
    if (num_kv_heads % tp.size != 0)
      throw InvalidArgument(
          fmt::format("--tensor-parallel-size {} does not divide num_key_value_heads {}", tp.size,
                      num_kv_heads));
    s.kv_heads = even_part(num_kv_heads, tp.rank, tp.size);
  } else {
    if (tp.size % num_kv_heads != 0)
      throw InvalidArgument(fmt::format(
          "--tensor-parallel-size {} is larger than num_key_value_heads {} but not a multiple "
          "of it, so KV heads cannot be replicated evenly",
          tp.size, num_kv_heads));
    int64_t kv = int64_t{tp.rank} * num_kv_heads / tp.size;
    s.kv_heads = {kv, kv + 1};
    s.kv_replicated = true;
  }
  s.q_rows = scaled(s.q_heads, head_dim);
  s.kv_rows = scaled(s.kv_heads, head_dim);
  s.o_cols = s.q_rows;
  return s;
}

Range shard_intermediate(const TpLayout& tp, int64_t intermediate, int64_t granule) {
  validate(tp);
  if (intermediate < 1 || granule < 1)
    throw InvalidArgument(
        fmt::format("intermediate size {} and granule {} must be positive", intermediate, granule));
  if (intermediate % tp.size != 0)
    throw InvalidArgument(
        fmt::format("--tensor-parallel-size {} does not divide the intermediate size {}", tp.size,
                    intermediate));
  int64_t part = intermediate / tp.size;
  if (part % granule != 0)
    throw InvalidArgument(fmt::format(
        "intermediate size {} split {} ways gives {} per rank, not a multiple of the weight "
        "quantization block {}; use a smaller --tensor-parallel-size or "
        "--enable-expert-parallel",
        intermediate, tp.size, part, granule));
  return even_part(intermediate, tp.rank, tp.size);
}

VocabShard shard_vocab(const TpLayout& tp, int64_t vocab) {
  validate(tp);
  if (vocab < 1) throw InvalidArgument(fmt::format("vocab_size {} must be positive", vocab));
  VocabShard s;
  s.padded_vocab = round_up(vocab, kVocabPadding * tp.size);
  s.padded = even_part(s.padded_vocab, tp.rank, tp.size);
  s.real = {std::min(s.padded.begin, vocab), std::min(s.padded.end, vocab)};
  return s;
}

void validate(const ParallelConfig& p) {
  if (p.tp_size < 1 || p.dp_size < 1)
    throw InvalidArgument(
        fmt::format("--tensor-parallel-size {} and --data-parallel-size {} must be >= 1", p.tp_size,
                    p.dp_size));
}

int global_rank(const ParallelConfig& p, RankCoord c) {
  validate(p);
  if (c.dp_rank < 0 || c.dp_rank >= p.dp_size || c.tp_rank < 0 || c.tp_rank >= p.tp_size)
    throw InvalidArgument(fmt::format("rank (dp {}, tp {}) outside dp_size {} x tp_size {}",
                                      c.dp_rank, c.tp_rank, p.dp_size, p.tp_size));
  return c.dp_rank * p.tp_size + c.tp_rank;
}

RankCoord rank_coord(const ParallelConfig& p, int global_rank) {
  validate(p);
  if (global_rank < 0 || global_rank >= p.world_size())
    throw InvalidArgument(
        fmt::format("global rank {} outside world size {}", global_rank, p.world_size()));
  return {global_rank / p.tp_size, global_rank % p.tp_size};
}

MoeShard shard_moe(const ParallelConfig& p, RankCoord c, int num_experts, int64_t moe_intermediate,
                   int64_t granule) {
  int rank = global_rank(p, c);
  if (num_experts < 1)
    throw InvalidArgument(fmt::format("num_experts {} must be positive", num_experts));
  MoeShard s;
  if (!p.enable_expert_parallel) {
    s.experts = {0, num_experts};
    s.intermediate = shard_intermediate({c.tp_rank, p.tp_size}, moe_intermediate, granule);
    return s;
  }
  s.ep_size = p.world_size();
  s.ep_rank = rank;
  if (num_experts % s.ep_size != 0)
    throw InvalidArgument(
        fmt::format("--enable-expert-parallel: {} experts do not split evenly over {} ranks "
                    "(data-parallel {} x tensor-parallel {})",
                    num_experts, s.ep_size, p.dp_size, p.tp_size));
  if (moe_intermediate < 1)
    throw InvalidArgument(
        fmt::format("moe intermediate size {} must be positive", moe_intermediate));
  s.experts = even_part(num_experts, s.ep_rank, s.ep_size);
  s.intermediate = {0, moe_intermediate};
  return s;
}

int expert_owner(const ParallelConfig& p, int num_experts, int e) {
  validate(p);
  if (!p.enable_expert_parallel)
    throw InvalidArgument("expert_owner: expert parallel is off, every rank holds every expert");
  if (e < 0 || e >= num_experts || num_experts % p.world_size() != 0)
    throw InvalidArgument(
        fmt::format("expert {} of {} over {} ranks", e, num_experts, p.world_size()));
  return e / (num_experts / p.world_size());
}

}  // namespace serval::dist
