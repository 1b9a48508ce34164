// Collectives between the ranks of a tensor- / expert-parallel group, each rank with its own
// Backend. The in-process CPU implementation runs the ranks as threads of one process; the CUDA
// one wraps NCCL (one GPU per rank).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "tensor/tensor.h"

namespace serval::backend {

// Every collective must be called by all ranks of the group, in the same order, with tensors of
// the same shape and dtype (each on its own rank's device). Calls are ordered with the rank's
// other backend work (on CUDA: enqueued on the backend's stream).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // t ← Σ_r t_r over the ranks, in place. The CPU implementation sums in rank order 0..N-1,
  // so every rank gets bit-identical results and repeated runs are reproducible.
  virtual void all_reduce_sum(Tensor& t) = 0;
  // The all-reduce of a row-parallel layer fused with the residual add and RMSNorm after it:
  // residual [T, H] += Σ_r delta_r (rounded to the activation dtype once), then
  // x ← RMSNorm(residual) · weight, in one step where the communicator can (the CUDA one on a
  // single-process NVLink group). Returns false, touching nothing, where it cannot: the caller
  // then runs all_reduce_sum(delta) and Backend::rms_norm(delta, &residual, ...) itself.
  virtual bool all_reduce_add_rms_norm(const Tensor& /*delta*/, Tensor& /*residual*/,
                                       const Tensor& /*weight*/, float /*eps*/, Tensor& /*x*/) {
    return false;
  }
  // out [rows, total_cols] f32 ← the ranks' column slices side by side: this rank contributes
  // local [rows, n] at columns [col_begin, col_begin + n) (n may be 0). The ranks' slices must
  // be disjoint and cover [0, total_cols). Implemented as a zero-fill, a copy and an all-reduce,
  // which is exact (x + 0 = x).
  virtual void all_gather_columns(const Tensor& local, int64_t col_begin, Tensor& out) = 0;
  // Makes this rank's pending and future collectives fail (serval::Error) instead of waiting on
  // peers: called when a rank failed mid-step so the other ranks' threads do not hang.
  virtual void abort() {}

  // Local-only mode, for start-up warm-ups a rank runs alone: all_reduce_sum leaves each rank's
  // own values (Σ over this rank only) and all_reduce_add_rms_norm declines, so no call waits on
  // a peer. Set between steps, from the thread that runs them.
  void set_local_only(bool on) { local_only_ = on; }

 protected:
  bool local_only() const { return local_only_; }

 private:
  bool local_only_ = false;
};

// Sums f32 vectors over the nodes of a multi-node group: every node passes its partial sum and
// gets the total back, the same bits on every node (node 0 adds the partials in node order).
// Calls that cannot complete (a node lost) throw serval::Error; abort() makes them fail.
class NodeExchange {
 public:
  virtual ~NodeExchange() = default;
  virtual void all_reduce(std::vector<float>& values) = 0;
  virtual void abort() = 0;
};

// `size` communicators over one in-process group, rank r at index r; the ranks must call the
// collectives from different threads. f32 tensors in host memory (the CPU backend's).
// With `nodes`, the group is one node's share of a multi-node group: the communicators are
// global ranks first_rank .. first_rank + size − 1 of `world`, and every all-reduce adds the
// node's ranks in order, then the nodes' sums through `nodes`.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(
    int size, std::shared_ptr<NodeExchange> nodes = nullptr, int first_rank = 0, int world = 0);

// One NCCL communicator per backend (rank r = backends[r], on CUDA device first_device + r),
// created together with ncclCommInitAll after setting NCCL_NVLS_ENABLE=0 when it is unset (NVLink
// multicast off). Throws InvalidArgument when serval was built without CUDA or a backend is not a
// CUDA backend.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    std::span<Backend* const> backends, int first_device = 0);

// Multi-node groups (one process per node): an NCCL unique id made on node 0 and handed to the
// other nodes (dist::Leader::rendezvous), then every node creates its ranks' communicators with
// it: backends[i] is global rank first_rank + i of `world`, on CUDA device first_device + i. All
// nodes must call this at the same point (ncclCommInitRank is collective).
using NcclUniqueId = std::array<uint8_t, 128>;
NcclUniqueId make_nccl_unique_id();
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    std::span<Backend* const> backends, int first_device, const NcclUniqueId& id, int world,
    int first_rank);

// For a process whose threads drive several GPUs that wait on each other in collectives (tensor
// or expert parallel ranks in one process): call before the process's first CUDA call. Asks the
// driver to load every kernel at start-up (CUDA_MODULE_LOADING=EAGER) unless the environment
// already names a mode. With lazy loading, the CUDA 12+ default, a kernel's first launch may wait
// in the driver for a device to drain while that device spins in an all-reduce for a peer whose
// host thread is blocked behind the same load: a deadlock (the lazy-loading hazard for kernels
// that wait on each other, in the CUDA programming guide; seen as a hang of TP=2 decode-graph
// warm-ups of MoE models). Too late once CUDA is initialized: the P2P all-reduce warns then.
void prefer_eager_cuda_module_loading();

// Makes CUDA device `device` current for the calling thread (cudaSetDevice), which must precede
// creating or using that rank's CUDA backend. InvalidArgument naming the device count when it
// does not exist; a no-op without CUDA (the CPU backend ignores devices).
void bind_cuda_device(int device);

}  // namespace serval::backend
