#include "distributed/collectives.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <utility>

#include "distributed/impl.hpp"
#include "error.hpp"

namespace keel {

struct Pending::State {
  const ProcessGroup::Impl* group = nullptr;
  std::string what;
  c10::intrusive_ptr<c10d::Work> work;  // null: nothing to wait for (no data moved)
  std::function<void()> epilogue;        // may be empty
  bool done = false;
};

void Pending::wait() {
  if (!state_ || state_->done) return;
  State& s = *state_;
  s.group->guarded(s.what, [&] {
    if (s.work) s.work->wait();
  });
  s.done = true;
  s.work.reset();
  if (s.epilogue) {
    at::NoGradGuard no_grad;  // outputs may be views of parameters or their gradients
    std::function<void()> epilogue = std::move(s.epilogue);
    epilogue();
  }
}

bool Pending::active() const { return state_ && !state_->done; }

namespace {

// True when the collectives of `group` run on NCCL (its native reduce-scatter and flat
// all-gather exist there).
bool native(const ProcessGroup::Impl& group) { return group.backend == "nccl"; }

int64_t numel_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.numel();
  return n;
}

}  // namespace

Collectives::Collectives(ProcessGroup& group) : group_(&group.impl()) {}

Collectives::~Collectives() = default;

Pending Collectives::pending(const std::string& what) const {
  Pending p;
  p.state_ = std::make_shared<Pending::State>();
  p.state_->group = group_;
  p.state_->what = what;
  return p;
}

int Collectives::rank() const { return group_->launch.rank; }

int Collectives::world() const { return group_->launch.world_size; }

Pending Collectives::reduce_scatter(at::Tensor packed, std::vector<at::Tensor> out,
                                    double divide_by, bool accumulate, const std::string& what) {
  const int64_t world = group_->launch.world_size;
  const int64_t chunk = numel_of(out);  // C: this rank's elements, from every rank
  if (packed.numel() != world * chunk || !packed.is_contiguous())
    throw Error(fmt::format(
        "internal: {}: reduce-scatter of {} elements (contiguous: {}) into {} ranks x {} elements",
        what, packed.numel(), packed.is_contiguous() ? "yes" : "no", world, chunk));
  for (const at::Tensor& o : out)
    if (o.scalar_type() != packed.scalar_type())
      throw Error("internal: " + what + ": reduce-scatter outputs of another dtype than the input");
  Pending p = pending(what);
  Pending::State& s = *p.state_;
  if (chunk == 0) return p;  // every rank has the same shapes: nothing moves anywhere
  at::Tensor mine = at::empty({native(*group_) ? chunk : world * chunk}, packed.options());
  group_->guarded(what, [&] {
    group_->issued += 1;
#ifdef KEEL_WITH_NCCL
    if (native(*group_)) {
      c10d::ReduceScatterOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      s.work = group_->pg->_reduce_scatter_base(mine, packed, o);
      return;
    }
#endif
    std::vector<int64_t> equal_splits;  // empty: W equal parts
    s.work = group_->pg->alltoall_base(mine, packed, equal_splits, equal_splits,
                                       c10d::AllToAllOptions());
  });
  const bool summed = native(*group_);
  // `packed` is kept until then: the transfer reads it.
  s.epilogue = [packed, mine, out = std::move(out), world, chunk, divide_by, accumulate, summed] {
    at::Tensor sum = mine;
    if (!summed) {
      // mine = [rank 0's chunk for this rank | rank 1's | ...]: added in rank order.
      sum = mine.narrow(0, 0, chunk).clone();
      for (int64_t q = 1; q < world; ++q) sum.add_(mine.narrow(0, q * chunk, chunk));
    }
    if (divide_by != 1.0) sum.div_(divide_by);
    int64_t offset = 0;
    for (const at::Tensor& o : out) {
      const int64_t n = o.numel();
      if (n == 0) continue;
      const at::Tensor part = sum.narrow(0, offset, n).view(o.sizes());
      if (accumulate)
        o.add_(part);
      else
        o.copy_(part);
      offset += n;
    }
  };
  return p;
}

Pending Collectives::all_gather(std::vector<at::Tensor> inputs,
                                std::vector<std::vector<at::Tensor>> outputs,
                                const std::string& what) {
  const size_t world = static_cast<size_t>(group_->launch.world_size);
  if (outputs.size() != world)
    throw Error(fmt::format("internal: {}: all-gather into {} ranks' outputs, with {} ranks", what,
                            outputs.size(), world));
  // Empty tensors move nothing (and Gloo's coalesced all-gather need not see them).
  std::vector<at::Tensor> in;
  std::vector<std::vector<at::Tensor>> into(world);
  for (size_t k = 0; k < inputs.size(); ++k) {
    for (size_t q = 0; q < world; ++q)
      if (outputs[q].size() != inputs.size() || !outputs[q][k].sizes().equals(inputs[k].sizes()))
        throw Error(fmt::format(
            "internal: {}: all-gather output of rank {} does not have the inputs' count and shapes",
            what, q));
    if (inputs[k].numel() == 0) continue;
    in.push_back(inputs[k].contiguous());
    for (size_t q = 0; q < world; ++q) into[q].push_back(outputs[q][k]);
  }
  Pending p = pending(what);
  Pending::State& s = *p.state_;
  if (in.empty()) return p;
#ifdef KEEL_WITH_NCCL
  if (native(*group_)) {
    // One flat buffer each way; the epilogue copies rank q's part into outputs[q].
    std::vector<at::Tensor> flat_in;
    for (const at::Tensor& t : in) flat_in.push_back(t.reshape({-1}));
    at::Tensor send = at::cat(flat_in);
    at::Tensor recv = at::empty({static_cast<int64_t>(world) * send.numel()}, send.options());
    group_->guarded(what, [&] {
      group_->issued += 1;
      s.work = group_->pg->_allgather_base(recv, send, c10d::AllgatherOptions());
    });
    s.epilogue = [recv, send, into = std::move(into)] {
      const int64_t c = send.numel();
      for (size_t q = 0; q < into.size(); ++q) {
        int64_t offset = static_cast<int64_t>(q) * c;
        for (const at::Tensor& o : into[q]) {
          o.copy_(recv.narrow(0, offset, o.numel()).view(o.sizes()));
          offset += o.numel();
        }
      }
    };
    return p;
  }
#endif
  group_->guarded(what, [&] {
    group_->issued += 1;
    s.work = group_->pg->allgather_coalesced(into, in, c10d::AllgatherOptions());
  });
  // The engine writes `into` itself; they stay referenced until the work is done.
  s.epilogue = [in = std::move(in), into = std::move(into)] {};
  return p;
}

std::vector<std::vector<double>> Collectives::exchange(const std::vector<double>& values,
                                                       const std::string& what) {
  const size_t world = static_cast<size_t>(group_->launch.world_size);
  std::vector<std::vector<double>> out(world);
  if (values.empty()) return out;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<at::Tensor> in{at::tensor(values, f64).to(group_->comm)};
  std::vector<std::vector<at::Tensor>> all(1);
  for (size_t q = 0; q < world; ++q)
    all[0].push_back(at::empty({static_cast<int64_t>(values.size())}, in[0].options()));
  group_->guarded(what, [&] {
    group_->issued += 1;
    group_->pg->allgather(all, in, c10d::AllgatherOptions())->wait();
  });
  for (size_t q = 0; q < world; ++q) {
    const at::Tensor t = all[0][q].cpu();
    const double* v = t.data_ptr<double>();
    out[q].assign(v, v + values.size());
  }
  return out;
}

}  // namespace keel
