// LD_PRELOAD library: records the GPU start and end of every kernel a program runs (CUPTI's
// concurrent-kernel activity, so CUDA-graph nodes and PDL overlap are seen as they ran, without
// probes between them) and writes them as CSV to $SERVAL_KERNEL_TRACE (default kernel-trace.csv)
// when the program exits:
//   start_ns,end_ns,graph_id,graph_node_id,grid,block,name   (name mangled; one row per kernel)
// Built and run by tools/kernel-trace.sh on the GPU machine; summarized by
// tools/kernel_trace_report.py. Not part of the serval build (CUPTI is not a build dependency).
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

std::mutex g_mutex;
FILE* g_out = nullptr;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t(16) << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || g_out == nullptr) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(g_out, "%llu,%llu,%u,%llu,%dx%dx%d,%dx%dx%d,%s\n",
                 static_cast<unsigned long long>(k->start), static_cast<unsigned long long>(k->end),
                 k->graphId, static_cast<unsigned long long>(k->graphNodeId), k->gridX, k->gridY,
                 k->gridZ, k->blockX, k->blockY, k->blockZ, k->name ? k->name : "?");
  }
  std::free(buffer);
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, msg ? msg : "?");
}

__attribute__((constructor)) void start_trace() {
  const char* path = std::getenv("SERVAL_KERNEL_TRACE");
  g_out = std::fopen(path ? path : "kernel-trace.csv", "w");
  if (g_out == nullptr) {
    std::perror("kernel_trace: open");
    return;
  }
  std::fprintf(g_out, "start_ns,end_ns,graph_id,graph_node_id,grid,block,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel activity");
  // Deliver records every 100 ms too: the flush at exit may come after the CUDA runtime's own
  // teardown, so without this the last records could be lost.
  check(cuptiActivityFlushPeriod(100), "flush period");
}

__attribute__((destructor)) void stop_trace() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace
