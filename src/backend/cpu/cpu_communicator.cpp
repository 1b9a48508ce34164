// In-process all-reduce for ranks running as threads: a shared table of the ranks' buffers and
// an abortable barrier; every rank sums all buffers in rank order into a private copy. In a
// multi-node group, local rank 0 sums the node's buffers and trades that partial for the total
// through the NodeExchange; the other local ranks copy the total.
#include <algorithm>
#include <cstring>
#include <string>

#include "backend/communicator.h"
#include "base/abortable_barrier.h"
#include "base/error.h"

namespace serval::backend {

namespace {

// Shared state of one group: the rank buffers and a reusable barrier; abort() wakes every waiter
// with an Error.
class CpuGroup {
 public:
  CpuGroup(int size, std::shared_ptr<NodeExchange> nodes)
      : size_(size),
        nodes_(std::move(nodes)),
        barrier_(size, "CPU all-reduce aborted: another tensor-parallel rank failed"),
        buffers_(size_t(size)),
        numels_(size_t(size)) {}

  int size() const { return size_; }
  NodeExchange* nodes() const { return nodes_.get(); }
  // The cross-node total of the current all-reduce (written by local rank 0 between barriers).
  std::vector<float>& total() { return total_; }

  void barrier() { barrier_.arrive_and_wait(); }

  void abort() {
    barrier_.abort();
    if (nodes_) nodes_->abort();
  }

  void post(int rank, float* data, int64_t numel) {
    buffers_[size_t(rank)] = data;
    numels_[size_t(rank)] = numel;
  }
  const float* buffer(int rank) const { return buffers_[size_t(rank)]; }
  int64_t numel(int rank) const { return numels_[size_t(rank)]; }

 private:
  const int size_;
  const std::shared_ptr<NodeExchange> nodes_;
  std::vector<float> total_;
  AbortableBarrier barrier_;
  // Written by each rank for its own index before a barrier, read by all after it.
  std::vector<float*> buffers_;
  std::vector<int64_t> numels_;
};

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank, int first_rank, int world)
      : group_(std::move(group)), rank_(rank), first_rank_(first_rank), world_(world) {}
  int rank() const override { return first_rank_ + rank_; }
  int size() const override { return world_; }

  void all_reduce_sum(Tensor& t) override {
    if (t.dtype != DType::kF32)
      throw InvalidArgument("CPU all-reduce: f32 tensors only, got " +
                            std::string(dtype_name(t.dtype)) + " " + shape_str(t.shape));
    const int n = group_->size();
    if (world_ == 1 || local_only()) return;
    const int64_t numel = t.numel();
    group_->post(rank_, t.as<float>(), numel);
    group_->barrier();  // every buffer posted
    for (int r = 0; r < n; ++r) {
      if (group_->numel(r) != numel)
        throw InvalidArgument("CPU all-reduce: rank " + std::to_string(r) + " has " +
                              std::to_string(group_->numel(r)) + " elements, rank " +
                              std::to_string(rank_) + " has " + std::to_string(numel));
    }
    if (group_->nodes() == nullptr) {
      sum_.assign(group_->buffer(0), group_->buffer(0) + numel);
      for (int r = 1; r < n; ++r) {
        const float* src = group_->buffer(r);
        for (int64_t i = 0; i < numel; ++i) sum_[size_t(i)] += src[i];
      }
      group_->barrier();  // every rank has read every buffer: safe to overwrite our own
      std::copy(sum_.begin(), sum_.end(), t.as<float>());
      return;
    }
    if (rank_ == 0) {
      std::vector<float>& total = group_->total();
      total.assign(group_->buffer(0), group_->buffer(0) + numel);
      for (int r = 1; r < n; ++r) {
        const float* src = group_->buffer(r);
        for (int64_t i = 0; i < numel; ++i) total[size_t(i)] += src[i];
      }
      try {
        group_->nodes()->all_reduce(total);
      } catch (...) {
        group_->abort();  // release the local ranks waiting at the barrier
        throw;
      }
    }
    group_->barrier();  // the total is ready; every buffer has been read
    std::copy(group_->total().begin(), group_->total().end(), t.as<float>());
    group_->barrier();  // every rank copied the total before the next call replaces it
  }

  void all_gather_columns(const Tensor& local, int64_t col_begin, Tensor& out) override {
    const int64_t rows = out.dim(0), cols = out.dim(1);
    const int64_t n = local.numel() == 0 ? 0 : local.dim(1);
    check(out.dtype == DType::kF32 && (n == 0 || local.dtype == DType::kF32),
          "all_gather_columns: f32 tensors");
    check(n == 0 || local.dim(0) == rows, "all_gather_columns: equal row counts");
    check(col_begin >= 0 && col_begin + n <= cols, "all_gather_columns: slice within out");
    std::fill_n(out.as<float>(), out.numel(), 0.0f);
    for (int64_t r = 0; r < rows && n > 0; ++r)
      std::memcpy(out.as<float>() + r * cols + col_begin, local.as<float>() + r * n,
                  size_t(n) * sizeof(float));
    all_reduce_sum(out);
  }

  void abort() override { group_->abort(); }

 private:
  std::shared_ptr<CpuGroup> group_;
  int rank_;  // local rank
  int first_rank_, world_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(
    int size, std::shared_ptr<NodeExchange> nodes, int first_rank, int world) {
  if (size < 1)
    throw InvalidArgument("make_cpu_communicators: size " + std::to_string(size) + " < 1");
  if (world == 0) world = size;
  if (first_rank < 0 || first_rank + size > world || (!nodes && world != size))
    throw InvalidArgument("make_cpu_communicators: local ranks " + std::to_string(first_rank) +
                          ".." + std::to_string(first_rank + size - 1) + " of " +
                          std::to_string(world) + (nodes ? "" : " without a node exchange"));
  auto group = std::make_shared<CpuGroup>(size, std::move(nodes));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r)
    out.push_back(std::make_unique<CpuCommunicator>(group, r, first_rank, world));
  return out;
}

}  // namespace serval::backend
