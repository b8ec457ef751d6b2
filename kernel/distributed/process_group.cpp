#include "distributed/process_group.hpp"

#include <csignal>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef KEEL_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "distributed/collectives.hpp"
#include "accelerator.hpp"
#include "compat/torch.hpp"
#include "distributed/impl.hpp"
#include "error.hpp"

namespace keel {

namespace {

// The first line of an engine error, bounded (Gloo and c10d messages can carry a backtrace).
std::string first_line(std::string text) {
  const size_t nl = text.find('\n');
  if (nl != std::string::npos) text.resize(nl);
  if (text.size() > 300) text = text.substr(0, 300) + "...";
  return text;
}

}  // namespace

Error ProcessGroup::Impl::failure(const std::string& what, const std::string& why) const {
  return Error(fmt::format(
      "distributed: {} failed on rank {} of {} ({}); hint: another rank failed, was killed or "
      "hangs (its log says which), or did not get here within [distributed] timeout_s = {} s",
      what, launch.rank, launch.world_size, first_line(why), timeout.count()));
}

ProcessGroup::ProcessGroup(const Launch& launch, const DistributedOptions& options,
                           const at::Device& device)
    : launch_(launch), options_(options), impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.launch = launch;
  d.timeout = options.timeout;
  std::string backend = options.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  if (backend == "nccl" && !device.is_cuda())
    throw Error("distributed.backend = \"nccl\" needs [run] device = \"cuda\" (NCCL reduces "
                "CUDA tensors); hint: use backend = \"auto\" or \"gloo\" on the CPU");
#ifndef KEEL_WITH_NCCL
  if (backend == "nccl")
    throw Error("distributed.backend = \"nccl\": this keel was built without NCCL (a CPU "
                "LibTorch); hint: use backend = \"gloo\" or \"auto\"");
#endif
  d.backend = backend;
  if (backend == "nccl") check_nccl_library();
  d.comm = backend == "nccl" ? device : at::Device(at::kCPU);
  // A write to a socket whose peer has closed raises SIGPIPE unless the writer asks otherwise,
  // and some write of Gloo's (or c10d's) does not: its default action ended the process
  // silently once a peer had gone, before the error line this class gives
  // (3 of 180 runs of the collectives units' "a peer that exits", two at a time). Python,
  // where torch.distributed runs, ignores SIGPIPE from its start; so does every keel process
  // that joins a group, from here on: the write fails with EPIPE, and Gloo reports it.
  std::signal(SIGPIPE, SIG_IGN);
  const std::string where = launch.master_addr + ":" + std::to_string(launch.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(launch.master_port);
    // torchrun's agent already serves a store there; otherwise rank 0 serves it.
    so.isServer = !launch.agent_store && launch.rank == 0;
    so.numWorkers = launch.world_size;
    so.waitWorkers = false;
    so.timeout = options.timeout;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(launch.master_addr, so);
    // The keys of each torchrun restart apart (what torch.distributed does with the agent's
    // store), and keel's apart from the agent's own.
    const std::string prefix =
        launch.agent_store ? "/worker/attempt_" + std::to_string(launch.restart_count) + "/keel"
                           : "keel";
    d.store_prefix = prefix;
    d.store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
  } catch (const std::exception& e) {
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    throw Error(fmt::format(
        "distributed: rank {} could not {} the rendezvous store at {} ({}); hint: MASTER_ADDR "
        "and MASTER_PORT must name a free port on the host of rank 0, the same for every rank, "
        "and every rank must start within [distributed] timeout_s = {} s",
        launch.rank, launch.rank == 0 && !launch.agent_store ? "serve" : "reach", where,
        first_line(c10 ? c10->what_without_backtrace() : e.what()), options.timeout.count()));
  }
  d.guarded("the process group's creation", [&] {
    if (backend == "gloo") {
      auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
      o->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      d.pg = compat::as_process_group(
          d.store, launch.rank, launch.world_size,
          c10::make_intrusive<c10d::ProcessGroupGloo>(d.store, launch.rank, launch.world_size, o),
          c10::DeviceType::CPU, /*nccl=*/false);
    }
#ifdef KEEL_WITH_NCCL
    if (backend == "nccl") {
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = options.timeout;
      d.pg = compat::as_process_group(
          d.store, launch.rank, launch.world_size,
          c10::make_intrusive<c10d::ProcessGroupNCCL>(d.store, launch.rank, launch.world_size, o),
          c10::DeviceType::CUDA, /*nccl=*/true);
    }
#endif
  });
}

ProcessGroup::~ProcessGroup() = default;

Error ProcessGroup::failure(const std::string& what, const std::string& why) const {
  return impl_->failure(what, why);
}

const std::string& ProcessGroup::backend_name() const { return impl_->backend; }

int64_t ProcessGroup::collectives_issued() const { return impl_->issued; }

Collectives& ProcessGroup::collectives() {
  if (!collectives_) collectives_ = std::make_unique<Collectives>(*this);
  return *collectives_;
}

ProcessGroup::Impl::Reduction ProcessGroup::Impl::start(const std::vector<double>& values,
                                                         c10d::ReduceOp op,
                                                         const std::string& what) {
  Reduction r;
  r.size = values.size();
  if (values.empty()) return r;
  r.values = at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(comm);
  guarded(what, [&] {
    issued += 1;
    std::vector<at::Tensor> v{r.values};
    c10d::AllreduceOptions o;
    o.reduceOp = op;
    r.work = pg->allreduce(v, o);
  });
  return r;
}

std::vector<double> ProcessGroup::Impl::finish(const Reduction& r, const std::string& what) {
  if (r.size == 0) return {};
  guarded(what, [&] { r.work->wait(); });
  const at::Tensor t = r.values.cpu();
  const double* p = t.data_ptr<double>();
  return std::vector<double>(p, p + r.size);
}

std::vector<double> ProcessGroup::Impl::reduce(std::vector<double> values, c10d::ReduceOp op,
                                               const std::string& what) {
  return finish(start(values, op, what), what);
}

struct PendingSum::State {
  ProcessGroup::Impl* group = nullptr;
  std::string what;
  ProcessGroup::Impl::Reduction reduction;
};

PendingSum::PendingSum() = default;
PendingSum::PendingSum(PendingSum&&) noexcept = default;
PendingSum& PendingSum::operator=(PendingSum&&) noexcept = default;
PendingSum::~PendingSum() = default;

std::vector<double> PendingSum::wait() {
  if (!state_) throw Error("internal: PendingSum::wait() without a sum in flight");
  const std::unique_ptr<State> s = std::move(state_);
  return s->group->finish(s->reduction, s->what);
}

PendingSum ProcessGroup::sum_async(std::vector<double> values, std::string what) {
  auto s = std::make_unique<PendingSum::State>();
  s->group = impl_.get();
  s->what = std::move(what);
  s->reduction = impl_->start(values, c10d::ReduceOp::SUM, s->what);
  PendingSum pending;
  pending.state_ = std::move(s);
  return pending;
}

std::vector<double> ProcessGroup::sum(std::vector<double> values, const std::string& what) {
  return impl_->reduce(std::move(values), c10d::ReduceOp::SUM, what);
}

std::vector<double> ProcessGroup::max(std::vector<double> values, const std::string& what) {
  return impl_->reduce(std::move(values), c10d::ReduceOp::MAX, what);
}

bool ProcessGroup::any(bool flag, const std::string& what) {
  return impl_->reduce({flag ? 1.0 : 0.0}, c10d::ReduceOp::MAX, what)[0] > 0;
}

void ProcessGroup::broadcast(const std::vector<at::Tensor>& tensors, const std::string& what) {
  if (tensors.empty()) return;
  impl_->guarded(what, [&] {
    at::NoGradGuard no_grad;  // parameters are leaves that require grad
    impl_->issued += 1;
    c10d::broadcast_coalesced(impl_->pg, tensors, 256 << 20, 0);
  });
}

void ProcessGroup::verify_same(const std::vector<at::Tensor>& tensors, const std::string& what) {
  impl_->issued += 1;
  try {
    c10d::verify_params_across_processes(impl_->pg, tensors, c10::nullopt);
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    // A mismatch names the ranks and counts or shapes; a lost peer is an engine failure.
    if (msg.find("DDP expects") == std::string::npos) throw impl_->failure(what, msg);
    throw Error("distributed: " + what + " differs between ranks (" + first_line(msg) +
                "); hint: start every rank with the same manifest, plugins and --set options");
  }
}

std::string ProcessGroup::share(const std::string& value, const std::string& what) {
  Impl& d = *impl_;
  const std::string key = "share/" + std::to_string(d.shared++);
  std::string out;
  d.guarded(what, [&] {
    if (launch_.rank == 0) {
      d.store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      out = value;
    } else {
      const std::vector<uint8_t> got = d.store->get(key);
      out.assign(got.begin(), got.end());
    }
  });
  return out;
}

std::vector<std::string> ProcessGroup::gather(const std::string& value,
                                              const std::string& what) {
  Impl& d = *impl_;
  const std::string key = "gather/" + std::to_string(d.shared++) + "/";
  std::vector<std::string> out;
  d.guarded(what, [&] {
    if (launch_.rank != 0) {
      d.store->set(key + std::to_string(launch_.rank),
                   std::vector<uint8_t>(value.begin(), value.end()));
      return;
    }
    out.push_back(value);
    for (int r = 1; r < launch_.world_size; ++r) {
      const std::vector<uint8_t> got = d.store->get(key + std::to_string(r));
      out.emplace_back(got.begin(), got.end());
    }
  });
  return out;
}

}  // namespace keel
