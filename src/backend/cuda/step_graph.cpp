#include "backend/cuda/step_graph.h"

#include <utility>

#include "backend/cuda/cuda_check.h"

namespace serval::backend::cuda {

CudaStepGraph::CudaStepGraph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream,
                             OpTimeline& timeline, std::vector<const char*> marks)
    : graph_(graph), exec_(exec), stream_(stream), timeline_(timeline), marks_(std::move(marks)) {}

CudaStepGraph::~CudaStepGraph() {
  cudaGraphExecDestroy(exec_);
  cudaGraphDestroy(graph_);
}

void CudaStepGraph::replay() {
  cuda_check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  if (timeline_.enabled()) timeline_.adopt(marks_);
}

}  // namespace serval::backend::cuda
