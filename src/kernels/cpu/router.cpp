// MoE router on the CPU: top-k expert ids and weights per token, fp32, ties to the lower index.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/ops.h"

namespace serval::kernels::cpu {

namespace {

// Indices of the k largest values, descending; equal values keep the lower index first.
std::vector<int> top_k_indices(const float* values, int n, int k) {
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

void softmax(float* x, int n) {
  float m = *std::max_element(x, x + n);
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] - m));
  for (int i = 0; i < n; ++i) x[i] /= sum;
}

void route_token(const RouterParams& p, const float* logits, int32_t* ids, float* weights) {
  const int E = p.num_experts, k = p.top_k;
  std::vector<float> scores(logits, logits + E);
  std::vector<int> chosen;
  switch (p.method) {
    case RoutingMethod::kSoftmaxTopK: {
      softmax(scores.data(), E);
      chosen = top_k_indices(scores.data(), E, k);
      for (int i = 0; i < k; ++i) weights[i] = scores[chosen[i]];
      break;
    }
    case RoutingMethod::kTopKSoftmax: {
      chosen = top_k_indices(scores.data(), E, k);
      for (int i = 0; i < k; ++i) weights[i] = scores[chosen[i]];
      softmax(weights, k);
      break;
    }
    case RoutingMethod::kSigmoidGroupedTopK: {
      for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
      std::vector<float> biased(scores);
      if (p.correction_bias)
        for (int e = 0; e < E; ++e) biased[e] += p.correction_bias[e];
      const int group_size = E / p.num_groups;
      std::vector<float> group_score(p.num_groups);
      for (int g = 0; g < p.num_groups; ++g) {
        auto top2 =
            top_k_indices(biased.data() + g * group_size, group_size, std::min(2, group_size));
        group_score[g] = 0;
        for (int i : top2) group_score[g] += biased[g * group_size + i];
      }
      auto groups = top_k_indices(group_score.data(), p.num_groups, p.topk_groups);
      std::vector<float> masked(E, -INFINITY);
      for (int g : groups)
        for (int e = g * group_size; e < (g + 1) * group_size; ++e) masked[e] = biased[e];
      chosen = top_k_indices(masked.data(), E, k);
      for (int i = 0; i < k; ++i) weights[i] = scores[chosen[i]];  // bias only selects
      break;
    }
  }
  if (p.renormalize && p.method != RoutingMethod::kTopKSoftmax) {
    float sum = 0;
    for (int i = 0; i < k; ++i) sum += weights[i];
    float eps = p.method == RoutingMethod::kSigmoidGroupedTopK ? 1e-20f : 0.0f;
    for (int i = 0; i < k; ++i) weights[i] /= (sum + eps);
  }
  for (int i = 0; i < k; ++i) {
    ids[i] = chosen[i];
    weights[i] *= p.routed_scaling_factor;
  }
}

}  // namespace

void route(const RouterParams& p) {
  check(p.top_k >= 1 && p.top_k <= p.num_experts, "router top_k in [1, num_experts]");
  for (int t = 0; t < p.num_tokens; ++t) {
    route_token(p, p.logits + size_t(t) * p.num_experts, p.topk_ids + size_t(t) * p.top_k,
                p.topk_weights + size_t(t) * p.top_k);
  }
}

}  // namespace serval::kernels::cpu
