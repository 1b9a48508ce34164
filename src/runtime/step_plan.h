// The per-step plan node 0 sends to the other nodes of a multi-node group (dist::Leader::
// send_plan), so that every node runs the same step on its ranks: the scheduled chunks, with
// their tokens and block tables. Also the one-time setup message (the KV block count node 0
// chose, which every rank must allocate). Little-endian, length-checked; decode throws
// dist::DistError naming what is malformed.
#pragma once
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "runtime/model_runner.h"

namespace serval::runtime {

// Sent once, after the weights are loaded and before the first step.
struct SetupPlan {
  int32_t num_blocks = 0;
};

// One step; owns the data that SeqChunk views. Only the new tokens travel (a step reads positions
// [start, start + num_new) alone; the KV cache holds the rest): `tokens` has start + num_new
// entries, those below `start` are 0.
struct StepPlan {
  struct Chunk {
    std::vector<int32_t> tokens;
    int32_t start = 0, num_new = 0;
    std::vector<int32_t> block_table;
    SeqChunk::Logits logits = SeqChunk::Logits::kLast;
  };
  std::vector<Chunk> chunks;
  // Views of `chunks` for StepRunner::execute (valid while this plan lives).
  std::vector<SeqChunk> views() const;
};

std::vector<uint8_t> encode_setup_plan(const SetupPlan& setup);
std::vector<uint8_t> encode_step_plan(std::span<const SeqChunk> chunks);

// Either message. Bounds: chunk count, token and block counts ≤ the payload size, num_new new
// tokens, start + num_new ≤ kMaxPlanPositions, logits mode known.
std::variant<SetupPlan, StepPlan> decode_plan(std::span<const uint8_t> bytes);

}  // namespace serval::runtime
