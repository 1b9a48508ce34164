// Which rows, columns, heads, vocabulary entries and experts each rank of a tensor-, data- and
// expert-parallel group holds. Pure functions of the model shape and the rank: every rank
// computes its own shard, and nothing is communicated to agree on it.
#pragma once
#include <cstdint>

namespace serval::dist {

// Half-open [begin, end) interval of indices along one dimension.
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool contains(int64_t i) const { return i >= begin && i < end; }
  friend bool operator==(const Range&, const Range&) = default;
};

// One rank of a tensor-parallel group of `size` ranks (0 <= rank < size).
struct TpLayout {
  int rank = 0, size = 1;
};
// Throws InvalidArgument unless size >= 1 and 0 <= rank < size.
void validate(const TpLayout& tp);

// Attention shard. Query heads are split evenly: rank r holds heads [r·H/size, (r+1)·H/size).
// KV heads: when num_kv_heads >= size they are split the same way (num_kv_heads % size == 0);
// when num_kv_heads < size each KV head is replicated on size/num_kv_heads consecutive ranks and
// rank r holds the single kv head r·num_kv_heads/size (size % num_kv_heads == 0), which is the
// KV head of every query head the rank holds.
// Weights (rows/columns counted in elements, i.e. heads·head_dim):
//   q_proj [H·head_dim, hidden]: column-parallel, rank keeps rows q_rows.
//   k_proj, v_proj [KV·head_dim, hidden]: rank keeps rows kv_rows (copies when replicated).
//   o_proj [hidden, H·head_dim]: row-parallel, rank keeps columns o_cols, outputs all-reduced.
// The KV cache of a rank holds kv_heads.size() heads per layer.
struct AttentionShard {
  Range q_heads;               // global query heads
  Range kv_heads;              // global KV heads
  bool kv_replicated = false;  // num_kv_heads < size
  int q_per_kv = 1;            // num_heads / num_kv_heads (GQA group size)
  Range q_rows, kv_rows, o_cols;

  // Local KV head used by local query head j (0 <= j < q_heads.size()).
  int local_kv_head(int local_q_head) const {
    return static_cast<int>((q_heads.begin + local_q_head) / q_per_kv - kv_heads.begin);
  }
};
// Throws InvalidArgument (naming the counts) unless num_heads % size == 0,
// num_heads % num_kv_heads == 0, and the KV split rule above applies.
AttentionShard shard_attention(const TpLayout& tp, int num_heads, int num_kv_heads, int head_dim);

// Intermediate (MLP hidden) dimension shard: rank r holds [r·I/size, (r+1)·I/size).
//   gate_proj, up_proj [I, hidden]: column-parallel, rank keeps these rows.
//   down_proj [hidden, I]: row-parallel, rank keeps these columns; outputs all-reduced.
// No padding: I must be divisible by size and each shard a multiple of `granule` (the weight
// quantization block along I: 1 for bf16, 16 for NVFP4 scales, 128 for block FP8), else
// InvalidArgument. Padding would change checkpoint shapes and split quantization blocks; the
// remedy for MoE models is --enable-expert-parallel, which keeps I whole.
Range shard_intermediate(const TpLayout& tp, int64_t intermediate, int64_t granule = 1);

// Rows of the vocabulary each rank's embedding and LM-head rows get. The table is padded to
// padded_vocab = round_up(vocab, kVocabPadding·size) so every shard has the same number of
// rows, a multiple of 64 (vLLM pads to 64 and then requires divisibility by size; padding to
// 64·size never fails). Padding rows hold zeros in the embedding and -inf logits in the head.
//   embedding: a token t with real.contains(t) reads local row t - padded.begin; other tokens
//              contribute zero on this rank; the outputs are all-reduced.
//   lm_head:   rank computes logits for padded rows; all-gather in rank order, keep [0, vocab).
inline constexpr int64_t kVocabPadding = 64;
struct VocabShard {
  int64_t padded_vocab = 0;
  Range padded;  // rows of the padded table, size padded_vocab / size
  Range real;    // padded ∩ [0, vocab): rows present in the checkpoint (may be empty)
};
VocabShard shard_vocab(const TpLayout& tp, int64_t vocab);

// Data × tensor parallel group. Global rank = dp_rank · tp_size + tp_rank; a DP replica is the
// tp_size consecutive global ranks with the same dp_rank.
struct ParallelConfig {
  int tp_size = 1, dp_size = 1;
  bool enable_expert_parallel = false;
  int world_size() const { return tp_size * dp_size; }
};
struct RankCoord {
  int dp_rank = 0, tp_rank = 0;
};
void validate(const ParallelConfig& p);  // sizes >= 1
int global_rank(const ParallelConfig& p, RankCoord c);
RankCoord rank_coord(const ParallelConfig& p, int global_rank);

// MoE shard of one rank.
// Expert parallel off: every rank holds all experts; each expert's intermediate dimension is
//   split over the TP group exactly like a dense MLP (shard_intermediate), and the DP replicas
//   hold identical copies.
// Expert parallel on: the experts are split over all dp_size·tp_size ranks (ep_rank = global
//   rank), local_num_experts = E / ep_size (E % ep_size == 0 required), each expert whole.
//   Tokens routed to experts of other ranks contribute zero on this rank and the combine is an
//   all-reduce (with DP, over the hidden states gathered from every replica).
struct MoeShard {
  Range experts;       // global expert ids [local_expert_offset, +local_num_experts)
  Range intermediate;  // slice of every held expert's intermediate dimension
  int ep_rank = 0, ep_size = 1;

  int local_expert_offset() const { return static_cast<int>(experts.begin); }
  int local_num_experts() const { return static_cast<int>(experts.size()); }
  // Local index of global expert e, or -1 when it lives on another rank.
  int local_expert(int e) const {
    return experts.contains(e) ? e - static_cast<int>(experts.begin) : -1;
  }
};
MoeShard shard_moe(const ParallelConfig& p, RankCoord c, int num_experts, int64_t moe_intermediate,
                   int64_t granule = 1);

// The global rank holding expert e under expert parallel. InvalidArgument when EP is off
// (every rank holds every expert) or e is out of range.
int expert_owner(const ParallelConfig& p, int num_experts, int e);

}  // namespace serval::dist
