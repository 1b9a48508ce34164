#include "runtime/multi_node.h"

#include <fmt/format.h>

#include <mutex>
#include <variant>

#include "backend/communicator.h"
#include "base/error.h"
#include "base/log.h"
#include "dist/dist_error.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"
#include "io/json_reader.h"
#include "runtime/engine_loader.h"
#include "runtime/step_plan.h"
#include "runtime/tcp_node_exchange.h"

namespace serval::runtime {
namespace {

// A CPU step of a large model can take minutes; a silent node beyond this is lost.
constexpr double kStepTimeoutS = 3600;

dist::RendezvousOptions rendezvous_options(const EngineConfig& cfg, uint64_t hash) {
  const dist::HostPort at = dist::parse_host_port(cfg.dist_init_addr);
  dist::RendezvousOptions o;
  o.host = at.host;
  o.port = at.port;
  o.node_rank = cfg.node_rank;
  o.nnodes = cfg.nnodes;
  o.config_hash = hash;
  o.timeout_s = cfg.dist_timeout_s;
  return o;
}

// What a lost node aborts: node 0's local ranks, once they exist. The leader's monitor thread
// calls abort() while the runner may be shutting down, hence the lock.
struct AbortTarget {
  std::mutex mu;
  ParallelRunner* runner = nullptr;
  void abort() {
    std::lock_guard lock(mu);
    if (runner != nullptr) runner->abort();
  }
  void set(ParallelRunner* r) {
    std::lock_guard lock(mu);
    runner = r;
  }
};

// Node 0: every step's plan goes to the other nodes before this node's ranks run it. The
// destructor ends the session (the leader's shutdown) before it destroys the local ranks: NCCL's
// ncclCommDestroy is collective across processes, so node 0 tearing its communicator down while
// the other nodes still wait for the next plan would wait for them forever.
class LeaderRunner final : public StepRunner {
 public:
  LeaderRunner(std::unique_ptr<dist::Leader> leader, std::unique_ptr<ParallelRunner> local,
               std::shared_ptr<AbortTarget> on_lost)
      : leader_(std::move(leader)), local_(std::move(local)), on_lost_(std::move(on_lost)) {
    on_lost_->set(local_.get());
  }
  ~LeaderRunner() override {
    on_lost_->set(nullptr);
    leader_.reset();  // the other nodes leave their step loops and tear down with this one
    local_.reset();
  }
  std::vector<float> execute(std::span<const SeqChunk> chunks) override {
    leader_->send_plan(encode_step_plan(chunks));
    return local_->execute(chunks);
  }
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk> chunks) override {
    leader_->send_plan(encode_step_plan(chunks));
    return local_->execute_greedy(chunks);
  }
  int block_size() const override { return local_->block_size(); }
  model::Model& model() override { return local_->model(); }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override { return local_->kv_cache(); }
  bool healthy() const override { return leader_->healthy(); }

 private:
  std::unique_ptr<dist::Leader> leader_;
  std::unique_ptr<ParallelRunner> local_;
  std::shared_ptr<AbortTarget> on_lost_;
};

// Nodes 1..N-1: runs node 0's plans; never schedules steps of its own.
class FollowerRunner final : public StepRunner {
 public:
  FollowerRunner(std::unique_ptr<dist::Follower> follower, std::unique_ptr<ParallelRunner> local)
      : follower_(std::move(follower)), local_(std::move(local)) {}

  // Until node 0 ends the session (0) or is lost (PeerLost propagates).
  void follow() {
    while (auto bytes = follower_->recv_plan()) {
      auto plan = decode_plan(*bytes);
      const StepPlan* step = std::get_if<StepPlan>(&plan);
      if (step == nullptr) throw dist::DistError("node 0 sent a second setup message mid-session");
      const std::vector<SeqChunk> chunks = step->views();
      // The collectives are the same either way; only ids leave the device.
      local_->execute_greedy(chunks);
    }
  }

  std::vector<float> execute(std::span<const SeqChunk>) override { refuse(); }
  std::vector<int32_t> execute_greedy(std::span<const SeqChunk>) override { refuse(); }
  int block_size() const override { return local_->block_size(); }
  model::Model& model() override { return local_->model(); }
  const std::vector<backend::KvCacheLayer>& kv_cache() const override { return local_->kv_cache(); }

 private:
  [[noreturn]] static void refuse() {
    throw Error("a follower node runs node 0's steps (follow()); it does not schedule its own");
  }
  std::unique_ptr<dist::Follower> follower_;
  std::unique_ptr<ParallelRunner> local_;
};

}  // namespace

NodePlacement node_placement(const EngineConfig& cfg, int world_size) {
  if (cfg.nnodes < 1) throw InvalidArgument(fmt::format("--nnodes {} must be >= 1", cfg.nnodes));
  if (cfg.node_rank < 0 || cfg.node_rank >= cfg.nnodes)
    throw InvalidArgument(
        fmt::format("node rank {} is outside 0..{}", cfg.node_rank, cfg.nnodes - 1));
  if (cfg.nnodes > 1 && cfg.data_parallel_size > 1)
    throw InvalidArgument(
        "--data-parallel-size with --nnodes > 1 is not supported yet; split "
        "the tensor-parallel group over the nodes instead");
  if (cfg.nnodes > 1 && cfg.dist_init_addr.empty())
    throw InvalidArgument("--nnodes > 1 needs --dist-init-addr HOST:PORT (node 0's address)");
  if (world_size % cfg.nnodes != 0)
    throw InvalidArgument(
        fmt::format("{} ranks (tensor parallel {}) cannot be split evenly over --nnodes {}",
                    world_size, cfg.tensor_parallel_size, cfg.nnodes));
  NodePlacement p;
  p.world = world_size;
  p.local_ranks = world_size / cfg.nnodes;
  p.first_rank = cfg.node_rank * p.local_ranks;
  return p;
}

uint64_t multi_node_config_hash(const EngineConfig& cfg, const std::string& config_json_text) {
  uint64_t h = dist::hash_bytes(config_json_text);
  const std::string flags = fmt::format(
      "tp={};ep={};nnodes={};dtype={};kv={};load={};len={};block={};seqs={};batched={};moe={}",
      cfg.tensor_parallel_size, cfg.enable_expert_parallel, cfg.nnodes, cfg.dtype,
      cfg.kv_cache_dtype, cfg.load_format, cfg.max_model_len, cfg.block_size, cfg.max_num_seqs,
      cfg.max_num_batched_tokens, cfg.moe_backend);
  return dist::hash_bytes(flags, h);
}

std::unique_ptr<StepRunner> load_multi_node_runner(
    const EngineConfig& cfg, const io::ModelConfig& mc, const model::WeightSource& weights,
    ParallelLoadOptions options,
    const std::function<int(backend::Backend&, const model::Model&)>& num_blocks) {
  const bool cuda = options.device == "cuda";
  const NodePlacement place = node_placement(cfg, options.parallel.world_size());
  const uint64_t hash =
      multi_node_config_hash(cfg, io::config_json_text(cfg.model_dir, cfg.hf_overrides));
  const dist::RendezvousOptions ro = rendezvous_options(cfg, hash);
  options.first_rank = place.first_rank;
  options.local_ranks = place.local_ranks;
  // The rendezvous blob: the NCCL unique id on CUDA; on the CPU, node 0's data port (first four
  // bytes, little-endian) for the TCP node exchange.
  dist::UniqueId blob{};
  std::shared_ptr<TcpNodeExchange> exchange;
  options.make_comms = [&](std::span<backend::Backend* const> local)
      -> std::vector<std::unique_ptr<backend::Communicator>> {
    if (!cuda)
      return backend::make_cpu_communicators(int(local.size()), exchange, place.first_rank,
                                             place.world);
    backend::NcclUniqueId id;
    std::copy(blob.begin(), blob.end(), id.begin());
    return backend::make_nccl_communicators(local, cfg.first_device, id, place.world,
                                            place.first_rank);
  };
  if (cfg.node_rank == 0) {
    log::info("multi-node: node 0 of {}, ranks 0..{} here; waiting for the other nodes on {}",
              cfg.nnodes, place.local_ranks - 1, cfg.dist_init_addr);
    auto leader = std::make_unique<dist::Leader>(ro);
    // A lost node fails the step in flight (its collectives would otherwise wait forever, NCCL
    // ones on the GPU); /health turns 503 through LeaderRunner::healthy.
    auto on_lost = std::make_shared<AbortTarget>();
    leader->set_on_peer_lost([on_lost](const std::string& why) {
      log::error("multi-node: {}; aborting this node's collectives", why);
      on_lost->abort();
    });
    if (cuda) {
      const backend::NcclUniqueId id = backend::make_nccl_unique_id();
      std::copy(id.begin(), id.end(), blob.begin());
    } else {
      exchange = TcpNodeExchange::listen(ro.host, cfg.nnodes, kStepTimeoutS);
      const uint32_t port = uint32_t(exchange->data_port());
      for (int i = 0; i < 4; ++i) blob[size_t(i)] = uint8_t(port >> (8 * i));
    }
    leader->rendezvous(blob);
    if (exchange) exchange->accept_all(cfg.dist_timeout_s);
    dist::Leader* l = leader.get();
    options.num_blocks = [&num_blocks, l](backend::Backend& b, const model::Model& m) {
      const int n = num_blocks(b, m);
      l->send_plan(encode_setup_plan({n}));
      return n;
    };
    auto local = load_parallel_runner(mc, weights, options);
    return std::make_unique<LeaderRunner>(std::move(leader), std::move(local), on_lost);
  }
  log::info("multi-node: node {} of {}, ranks {}..{}; joining node 0 at {}", cfg.node_rank,
            cfg.nnodes, place.first_rank, place.first_rank + place.local_ranks - 1,
            cfg.dist_init_addr);
  auto follower = std::make_unique<dist::Follower>(ro);
  blob = follower->unique_id();
  if (!cuda) {
    uint32_t port = 0;
    for (int i = 0; i < 4; ++i) port |= uint32_t(blob[size_t(i)]) << (8 * i);
    exchange = TcpNodeExchange::connect(ro.host, int(port), cfg.node_rank, cfg.nnodes,
                                        cfg.dist_timeout_s, kStepTimeoutS);
  }
  dist::Follower* f = follower.get();
  options.num_blocks = [f](backend::Backend&, const model::Model&) {
    auto bytes = f->recv_plan();
    if (!bytes) throw dist::DistError("node 0 ended the session before sending the setup");
    auto plan = decode_plan(*bytes);
    const SetupPlan* setup = std::get_if<SetupPlan>(&plan);
    if (setup == nullptr) throw dist::DistError("node 0 sent a step before the setup message");
    return int(setup->num_blocks);
  };
  auto local = load_parallel_runner(mc, weights, options);
  return std::make_unique<FollowerRunner>(std::move(follower), std::move(local));
}

int run_follower_node(const EngineConfig& cfg) {
  try {
    LoadedModel m = load_model(cfg);
    auto* follower = dynamic_cast<FollowerRunner*>(m.runner.get());
    if (follower == nullptr) throw Error("run_follower_node: this node is node 0");
    log::info("node {} ready; running node 0's steps", cfg.node_rank);
    follower->follow();
    log::info("node 0 ended the session; node {} exits", cfg.node_rank);
    return 0;
  } catch (const std::exception& e) {
    log::error("node {}: {}", cfg.node_rank, e.what());
    return 1;
  }
}

}  // namespace serval::runtime
