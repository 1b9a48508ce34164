// NCCL collectives for tensor parallel over the GPUs of one process (one rank per GPU, each
// rank driven by its own thread). Compiled in CUDA builds; run on the two-H200 machine.
#include <cuda.h>  // CUmoduleLoadingMode only: the driver is reached through the runtime
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/communicator.h"
#include "backend/cuda/cuda_check.h"
#include "base/error.h"
#include "base/log.h"
#include "kernels/cuda/comm/p2p_all_reduce.h"
#include "kernels/cuda/comm/p2p_all_reduce_norm.h"

namespace serval::backend {

namespace {

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw Error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    default:
      throw InvalidArgument("NCCL all-reduce: unsupported dtype " + std::string(dtype_name(t)));
  }
}

// Whether the driver loads kernels lazily (prefer_eager_cuda_module_loading says why that matters
// here); false when the driver cannot tell.
bool lazy_module_loading() {
  void* query = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &query, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || query == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  CUmoduleLoadingMode mode{};
  return reinterpret_cast<CUresult (*)(CUmoduleLoadingMode*)>(query)(&mode) == CUDA_SUCCESS &&
         mode == CU_MODULE_LAZY_LOADING;
}

// Staging blocks of kernels::cuda::p2p_all_reduce on every GPU of a single-process group, and the
// group's host-mapped abort word. Made only when every pair of the GPUs has peer access.
class P2pGroup {
 public:
  static constexpr size_t kMaxBytes = size_t(2) << 20;  // batch 64 × hidden 8192 × bf16 = 1 MB

  // Null (NCCL alone) when SERVAL_P2P_ALL_REDUCE=0, for one GPU, more than kP2pMaxRanks, or a
  // pair of GPUs without peer access.
  static std::shared_ptr<P2pGroup> make(const std::vector<int>& devices) {
    const char* env = std::getenv("SERVAL_P2P_ALL_REDUCE");
    const int n = int(devices.size());
    if ((env && std::string(env) == "0") || n < 2 || n > kernels::cuda::kP2pMaxRanks)
      return nullptr;
    for (int a : devices)
      for (int b : devices) {
        int ok = 0;
        if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || !ok)) {
          (void)cudaGetLastError();
          log::info("GPUs {} and {} have no peer access: all-reduces go through NCCL only", a, b);
          return nullptr;
        }
      }
    int current = 0;
    cuda::cuda_check(cudaGetDevice(&current), "cudaGetDevice");
    if (lazy_module_loading())
      log::warn(
          "CUDA loads kernels lazily: a kernel's first launch can deadlock with a peer-to-peer "
          "all-reduce in flight; set CUDA_MODULE_LOADING=EAGER (serval does when it starts the "
          "ranks before CUDA)");
    auto group = std::shared_ptr<P2pGroup>(new P2pGroup(devices));
    for (int i = 0; i < n; ++i) {
      cuda::cuda_check(cudaSetDevice(devices[size_t(i)]), "cudaSetDevice");
      for (int j = 0; j < n; ++j) {
        if (j == i) continue;
        const cudaError_t e = cudaDeviceEnablePeerAccess(devices[size_t(j)], 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
          cuda::cuda_check(e, "cudaDeviceEnablePeerAccess");
        (void)cudaGetLastError();  // "already enabled" is fine
      }
      void* block = nullptr;
      cuda::cuda_check(cudaMalloc(&block, kernels::cuda::p2p_rank_bytes(kMaxBytes)),
                       "cudaMalloc (all-reduce staging)");
      group->blocks_[size_t(i)] = static_cast<uint8_t*>(block);
    }
    for (int i = 0; i < n; ++i) {
      cuda::cuda_check(cudaSetDevice(devices[size_t(i)]), "cudaSetDevice");
      kernels::cuda::p2p_init_rank(group->blocks_[size_t(i)], kMaxBytes, group->blocks_.data(), n);
    }
    void* word = nullptr;
    cuda::cuda_check(
        cudaHostAlloc(&word, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc (abort word)");
    group->aborted_ = static_cast<volatile uint32_t*>(word);
    *group->aborted_ = 0;
    cuda::cuda_check(cudaSetDevice(current), "cudaSetDevice");
    return group;
  }

  ~P2pGroup() {
    for (size_t i = 0; i < blocks_.size(); ++i)
      if (blocks_[i]) {
        (void)cudaSetDevice(devices_[i]);
        (void)cudaFree(blocks_[i]);
      }
    if (aborted_) (void)cudaFreeHost(const_cast<uint32_t*>(aborted_));
  }

  // Sum of t over the ranks on `stream` (rank `rank`'s), or false when t does not fit the staging
  // contract (then NCCL does it).
  bool all_reduce(Tensor& t, int rank, cudaStream_t stream) {
    const size_t bytes = t.nbytes();
    if ((t.dtype != DType::kBF16 && t.dtype != DType::kF32) || bytes > kMaxBytes ||
        bytes % 16 != 0 || reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
      return false;
    if (*aborted_) throw Error("all-reduce after a rank failed");
    kernels::cuda::p2p_all_reduce({t.data, t.numel(), t.dtype, rank, int(blocks_.size()), kMaxBytes,
                                   blocks_[size_t(rank)], aborted_},
                                  stream);
    return true;
  }

  // residual += Σ delta; x = RMSNorm(residual) · weight on `stream`, or false when the shapes do
  // not fit the fused kernel (or SERVAL_FUSED_ALL_REDUCE_NORM=0).
  bool all_reduce_norm(const Tensor& delta, Tensor& residual, const Tensor& weight, float eps,
                       Tensor& x, int rank, cudaStream_t stream) {
    if (!fused_norm_ || delta.dtype != DType::kBF16 || residual.dtype != DType::kBF16 ||
        weight.dtype != DType::kBF16 || x.dtype != DType::kBF16 || delta.shape.size() != 2 ||
        residual.numel() != delta.numel() || x.numel() != delta.numel() ||
        weight.numel() != delta.dim(1))
      return false;
    kernels::cuda::P2pAllReduceNormParams p{};
    p.delta = static_cast<const bf16*>(delta.data);
    p.residual = static_cast<bf16*>(residual.data);
    p.weight = static_cast<const bf16*>(weight.data);
    p.out = static_cast<bf16*>(x.data);
    p.rows = int(delta.dim(0));
    p.hidden = int(delta.dim(1));
    p.eps = eps;
    p.rank = rank;
    p.ranks = int(blocks_.size());
    p.max_bytes = kMaxBytes;
    p.block = blocks_[size_t(rank)];
    p.aborted = aborted_;
    if (!kernels::cuda::p2p_all_reduce_norm_supported(p)) return false;
    if (*aborted_) throw Error("all-reduce after a rank failed");
    kernels::cuda::p2p_all_reduce_norm(p, stream);
    return true;
  }

  void abort() { *aborted_ = 1; }

 private:
  explicit P2pGroup(std::vector<int> devices)
      : devices_(std::move(devices)), blocks_(devices_.size(), nullptr) {}

  std::vector<int> devices_;
  std::vector<uint8_t*> blocks_;
  volatile uint32_t* aborted_ = nullptr;
  // SERVAL_FUSED_ALL_REDUCE_NORM=0 keeps the all-reduce and the norm apart (side-by-side timing).
  const bool fused_norm_ = [] {
    const char* env = std::getenv("SERVAL_FUSED_ALL_REDUCE_NORM");
    return env == nullptr || std::string(env) != "0";
  }();
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, cudaStream_t stream,
                   std::shared_ptr<P2pGroup> p2p = nullptr)
      : comm_(comm), rank_(rank), size_(size), stream_(stream), p2p_(std::move(p2p)) {}
  // An aborted communicator was already freed by ncclCommAbort.
  ~NcclCommunicator() override {
    if (ncclComm_t c = comm_.load()) ncclCommDestroy(c);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(Tensor& t) override {
    if (size_ == 1 || t.numel() == 0 || local_only()) return;
    if (log::tracing()) log::trace("rank {}: all-reduce of {} bytes", rank_, t.nbytes());
    if (p2p_ && p2p_->all_reduce(t, rank_, stream_)) return;
    nccl_check(ncclAllReduce(t.data, t.data, size_t(t.numel()), nccl_type(t.dtype), ncclSum, live(),
                             stream_),
               "ncclAllReduce");
  }

  bool all_reduce_add_rms_norm(const Tensor& delta, Tensor& residual, const Tensor& weight,
                               float eps, Tensor& x) override {
    if (size_ == 1 || delta.numel() == 0 || !p2p_ || local_only()) return false;
    if (log::tracing()) log::trace("rank {}: all-reduce + norm of {} bytes", rank_, delta.nbytes());
    return p2p_->all_reduce_norm(delta, residual, weight, eps, x, rank_, stream_);
  }

  void all_gather_columns(const Tensor& local, int64_t col_begin, Tensor& out) override {
    const int64_t rows = out.dim(0), cols = out.dim(1);
    const int64_t n = local.numel() == 0 ? 0 : local.dim(1);
    check(out.dtype == DType::kF32 && (n == 0 || local.dtype == DType::kF32),
          "all_gather_columns: f32 tensors");
    check(col_begin >= 0 && col_begin + n <= cols, "all_gather_columns: slice within out");
    cuda::cuda_check(cudaMemsetAsync(out.data, 0, out.nbytes(), stream_), "cudaMemsetAsync");
    if (n > 0) {
      const size_t elem = sizeof(float);
      cuda::cuda_check(
          cudaMemcpy2DAsync(static_cast<char*>(out.data) + size_t(col_begin) * elem,
                            size_t(cols) * elem, local.data, size_t(n) * elem, size_t(n) * elem,
                            size_t(rows), cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpy2DAsync");
    }
    all_reduce_sum(out);
  }

  // Stops this rank's in-flight collectives (their kernels poll NCCL's abort flag) and frees the
  // communicator; once only, from any thread. Later collectives throw.
  void abort() override {
    if (p2p_) p2p_->abort();
    if (ncclComm_t c = comm_.exchange(nullptr)) ncclCommAbort(c);
  }

 private:
  ncclComm_t live() const {
    ncclComm_t c = comm_.load();
    if (c == nullptr)
      throw Error("NCCL communicator of rank " + std::to_string(rank_) + " was aborted");
    return c;
  }

  std::atomic<ncclComm_t> comm_;
  int rank_, size_;
  cudaStream_t stream_;
  std::shared_ptr<P2pGroup> p2p_;  // small all-reduces of a single-process group, or null
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    std::span<Backend* const> backends, int first_device) {
  const int n = int(backends.size());
  for (int r = 0; r < n; ++r) {
    if (backends[size_t(r)]->device() != Device::kCuda || !backends[size_t(r)]->native_stream())
      throw InvalidArgument("NCCL communicators: rank " + std::to_string(r) +
                            " does not have a CUDA backend");
  }
  // NVLink multicast (NVLS) stays off: it needs fabric setup that these machines lack.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<int> devices(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) devices[size_t(r)] = first_device + r;
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::shared_ptr<P2pGroup> p2p = P2pGroup::make(devices);
  if (p2p)
    log::info("all-reduces up to {} KB go peer-to-peer (one kernel), larger through NCCL",
              P2pGroup::kMaxBytes >> 10);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(std::make_unique<NcclCommunicator>(
        comms[size_t(r)], r, n, static_cast<cudaStream_t>(backends[size_t(r)]->native_stream()),
        p2p));
  return out;
}

NcclUniqueId make_nccl_unique_id() {
  static_assert(sizeof(ncclUniqueId) == sizeof(NcclUniqueId));
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(
    std::span<Backend* const> backends, int first_device, const NcclUniqueId& id, int world,
    int first_rank) {
  const int n = int(backends.size());
  if (n < 1 || first_rank < 0 || first_rank + n > world)
    throw InvalidArgument("NCCL communicators: local ranks " + std::to_string(first_rank) + ".." +
                          std::to_string(first_rank + n - 1) + " do not fit a world of " +
                          std::to_string(world));
  for (int r = 0; r < n; ++r) {
    if (backends[size_t(r)]->device() != Device::kCuda || !backends[size_t(r)]->native_stream())
      throw InvalidArgument("NCCL communicators: rank " + std::to_string(first_rank + r) +
                            " does not have a CUDA backend");
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  // Several ranks of this process join in one group call (each on its own device).
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < n; ++r) {
    cuda::cuda_check(cudaSetDevice(first_device + r), "cudaSetDevice");
    nccl_check(ncclCommInitRank(&comms[size_t(r)], world, nid, first_rank + r), "ncclCommInitRank");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd (ncclCommInitRank of the local ranks)");
  cuda::cuda_check(cudaSetDevice(first_device), "cudaSetDevice");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(std::make_unique<NcclCommunicator>(
        comms[size_t(r)], first_rank + r, world,
        static_cast<cudaStream_t>(backends[size_t(r)]->native_stream())));
  return out;
}

void bind_cuda_device(int device) {
  int count = 0;
  cuda::cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (device < 0 || device >= count)
    throw InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                          std::to_string(count) +
                          " visible); tensor parallel needs one GPU per rank");
  cuda::cuda_check(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace serval::backend
