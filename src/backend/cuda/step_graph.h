// A decode step captured into a CUDA graph by CudaBackend::capture: the instantiated graph,
// replayed on the backend's stream, and the op-timeline marks its capture recorded.
#pragma once
#include <cuda_runtime_api.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/op_timeline.h"

namespace serval::backend::cuda {

class CudaStepGraph final : public StepGraph {
 public:
  // Takes ownership of graph and exec. marks: the timeline marks the capture made
  // (SERVAL_OP_TIMELINE), adopted at each replay.
  CudaStepGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, OpTimeline& timeline,
                std::vector<const char*> marks);
  ~CudaStepGraph() override;
  CudaStepGraph(const CudaStepGraph&) = delete;
  CudaStepGraph& operator=(const CudaStepGraph&) = delete;
  void replay() override;

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  OpTimeline& timeline_;
  std::vector<const char*> marks_;
};

}  // namespace serval::backend::cuda
