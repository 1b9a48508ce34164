// config.json of small models in real checkpoints' layouts, for dummy-weight tests
// (--load-format dummy) on the CPU and the GPU.
#pragma once
#include <nlohmann/json.hpp>

namespace serval::testing {

// DeepSeek-V3's layout and FP8 block quantization_config (128 × 128 blocks, weight_scale_inv, no
// ignored layers), shrunk: MLA with q_lora, a dense layer then an MoE layer of 8 routed experts
// with a shared one and sigmoid grouped routing.
inline nlohmann::json deepseek_v3_fp8_dummy_config() {
  return {{"architectures", {"DeepseekV3ForCausalLM"}},
          {"model_type", "deepseek_v3"},
          {"vocab_size", 512},
          {"hidden_size", 256},
          {"intermediate_size", 384},
          {"moe_intermediate_size", 128},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 4},
          {"n_shared_experts", 1},
          {"n_routed_experts", 8},
          {"num_experts_per_tok", 2},
          {"n_group", 4},
          {"topk_group", 2},
          {"topk_method", "noaux_tc"},
          {"scoring_func", "sigmoid"},
          {"routed_scaling_factor", 2.5},
          {"first_k_dense_replace", 1},
          {"q_lora_rank", 128},
          {"kv_lora_rank", 128},
          {"qk_nope_head_dim", 64},
          {"qk_rope_head_dim", 64},
          {"v_head_dim", 64},
          {"quantization_config",
           {{"activation_scheme", "dynamic"},
            {"fmt", "e4m3"},
            {"quant_method", "fp8"},
            {"weight_block_size", {128, 128}}}}};
}

}  // namespace serval::testing
