#include "distributed/sharding.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "distributed/collectives.hpp"
#include "distributed/grad_reduce.hpp"
#include "distributed/process_group.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"

namespace keel {

namespace {

// Contiguous strides of `shape`.
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// The index of the parameter whose storage `t` shares without being it, or -1.
int64_t aliased_param(const std::vector<at::Tensor>& params, const at::Tensor& t) {
  if (!t.has_storage()) return -1;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].unsafeGetTensorImpl() != t.unsafeGetTensorImpl() &&
        params[i].storage().is_alias_of(t.storage()))
      return static_cast<int64_t>(i);
  return -1;
}

}  // namespace

ShardedParams::ShardedParams(ProcessGroup& group, const std::vector<at::Tensor>& params,
                             const std::vector<std::string>& names,
                             const std::vector<at::Tensor>& model_state, int64_t bucket_bytes,
                             Mode mode, std::vector<std::vector<size_t>> groups)
    : group_(group), rank_(group.collectives().rank()), world_(group.collectives().world()),
      mode_(mode) {
  for (const at::Tensor& t : model_state)
    if (const int64_t i = aliased_param(params, t); i >= 0)
      throw Error("distributed.shard: a tensor of the model's state shares the storage of "
                  "parameter '" + names[i] + "' without being it (a weight tied through a "
                  "view); sharding moves each parameter's values, which would untie them; hint: "
                  "tie weights by using the same tensor, or set distributed.shard = \"none\"");
  const at::NoGradGuard no_grad;
  const int64_t w = world_;
  for (const at::Tensor& full : params) {
    Param p;
    p.full = full;
    p.rows = full.dim() == 0 ? 1 : full.size(0);
    p.row_numel = p.rows == 0 ? 0 : full.numel() / p.rows;
    p.chunk = (p.rows + w - 1) / w;
    p.begin = std::min<int64_t>(rank_ * p.chunk, p.rows);
    p.count = std::min<int64_t>(p.chunk, p.rows - p.begin);
    // The values into a padded storage; the model's tensor views its first rows.
    p.padded = at::empty({p.chunk * w * p.row_numel}, full.options().requires_grad(false));
    p.padded.narrow(0, p.rows * p.row_numel, (p.chunk * w - p.rows) * p.row_numel).zero_();
    p.padded.narrow(0, 0, full.numel()).copy_(full.reshape({-1}));
    full.set_data(p.padded.narrow(0, 0, full.numel()).view(full.sizes()));
    // This rank's rows as a leaf of its own over the same storage.
    std::vector<int64_t> shape = full.sizes().vec();
    if (full.dim() == 0) {
      if (rank_ != 0) shape = {0};
    } else {
      shape[0] = p.count;
    }
    p.shard = at::empty({0}, p.padded.options());
    if (mode == Mode::kParameters) {  // a storage of its own (residency.cpp fills it)
      p.home = at::zeros({p.chunk * p.row_numel}, p.padded.options());
      p.shard.set_(p.home.storage(), 0, shape, strides_of(shape));
    } else {
      p.shard.set_(p.padded.storage(), p.begin * p.row_numel, shape, strides_of(shape));
    }
    p.shard.requires_grad_(true);
    params_.push_back(std::move(p));
  }
  for (const Param& p : params_) handles_.push_back(peek(p.shard));
  // All-gather buckets: parameters in order, each bucket at most bucket_bytes (at least one
  // parameter).
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t b = params_[i].padded.numel() * params_[i].padded.element_size();
    if (buckets_.empty() || (bytes > 0 && bytes + b > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(i);
    bytes += b;
  }
  if (mode != Mode::kOptimizer) {
    std::vector<GradReduceScatter::Param> grads;
    for (size_t i = 0; i < params_.size(); ++i) {
      Param& p = params_[i];
      p.accum = at::zeros({p.chunk * p.row_numel}, p.padded.options());
      grads.push_back({names[i], p.full, p.accum, p.rows, p.row_numel, p.chunk});
    }
    reducer_ = mode == Mode::kParameters
                   ? std::make_unique<GradReduceScatter>(group.collectives(), std::move(grads),
                                                         std::move(groups), "parameters")
                   : std::make_unique<GradReduceScatter>(group.collectives(), std::move(grads),
                                                         bucket_bytes);
  }
  abi_group_.struct_size = sizeof(abi_group_);
  abi_group_.host_data = this;
  abi_group_.all_reduce = &ShardedParams::all_reduce;
}

ShardedParams::~ShardedParams() = default;

std::vector<at::Tensor> ShardedParams::tensors() const {
  std::vector<at::Tensor> out;
  for (const Param& p : params_) out.push_back(p.shard);
  return out;
}

void ShardedParams::clear_gradients() {
  for (Param& p : params_) {
    p.full.mutable_grad().reset();
    if (p.accum.defined()) p.accum.zero_();
  }
}

void ShardedParams::after_backward(const std::string& what) {
  if (reducer_) reducer_->finish_backward(what);
}

void ShardedParams::bind_gradients() {
  for (Param& p : params_) {
    if (p.accum.defined()) {  // "gradients": the accumulator's rows
      p.shard.mutable_grad() = p.accum.narrow(0, 0, p.count * p.row_numel).view(p.shard.sizes());
      continue;
    }
    const at::Tensor& g = p.full.grad();
    if (!g.defined()) {
      p.shard.mutable_grad().reset();
      continue;
    }
    p.shard.mutable_grad() =
        g.contiguous().reshape({-1}).narrow(0, p.begin * p.row_numel, p.count * p.row_numel)
            .view(p.shard.sizes());
  }
}

void ShardedParams::gather_parameters(const std::string& what) {
  Collectives& collectives = group_.collectives();
  std::vector<Pending> pending;
  for (const std::vector<size_t>& bucket : buckets_) {
    std::vector<at::Tensor> inputs;
    std::vector<std::vector<at::Tensor>> outputs(world_);
    for (size_t i : bucket) {
      const Param& p = params_[i];
      const int64_t n = p.chunk * p.row_numel;
      if (p.home.defined())  // kParameters: the shard lives in its own storage
        p.padded.narrow(0, rank_ * n, n).copy_(p.home);
      inputs.push_back(p.padded.narrow(0, rank_ * n, n));
      for (int q = 0; q < world_; ++q) outputs[q].push_back(p.padded.narrow(0, q * n, n));
    }
    issued_ += 1;
    pending.push_back(collectives.all_gather(std::move(inputs), std::move(outputs), what));
  }
  for (Pending& p : pending) p.wait();
}

void ShardedParams::on_group_sent(std::function<void(size_t group)> f) {
  if (reducer_) reducer_->on_sent = std::move(f);
}

int64_t ShardedParams::collectives_issued() const {
  return issued_ + (reducer_ ? reducer_->issued() : 0);
}

int64_t ShardedParams::shard_bytes() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.shard.numel() * p.shard.element_size();
  return n;
}

int64_t ShardedParams::param_bytes() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.full.numel() * p.full.element_size();
  return n;
}

std::string ShardedParams::describe() const {
  if (mode_ == Mode::kParameters)
    return fmt::format("{} parameters, gradients reduce-scattered in {} group(s) (one per unit "
                       "with parameters); this rank's shards hold {:.2f} of {:.2f} MiB",
                       params_.size(), reducer_->buckets(), shard_bytes() / 1048576.0,
                       param_bytes() / 1048576.0);
  return fmt::format("{} parameters in {} all-gather bucket(s){}; this rank's shards hold "
                     "{:.2f} of {:.2f} MiB",
                     params_.size(), buckets_.size(),
                     reducer_ ? fmt::format(", gradients reduce-scattered in {} bucket(s)",
                                            reducer_->buckets())
                              : std::string(),
                     shard_bytes() / 1048576.0, param_bytes() / 1048576.0);
}

keel_status ShardedParams::all_reduce(const keel_shard_group* group, double* values,
                                      size_t count, keel_reduce_op op, keel_error* err) {
  try {
    if (group == nullptr || (count > 0 && values == nullptr) ||
        (op != KEEL_REDUCE_SUM && op != KEEL_REDUCE_MAX))
      throw Error(fmt::format("all_reduce called with {}{}op {} (KEEL_REDUCE_SUM or _MAX)",
                              group ? "" : "no group, ", count > 0 && !values ? "no values, " : "",
                              static_cast<int>(op)));
    if (count == 0) return KEEL_OK;  // the same on every rank: nothing to combine
    auto* self = static_cast<ShardedParams*>(group->host_data);
    self->issued_ += 1;
    const std::vector<double> v(values, values + count);
    const std::string what = "combining a value over the shards' ranks (keel_shard_group)";
    const std::vector<double> r =
        op == KEEL_REDUCE_SUM ? self->group_.sum(v, what) : self->group_.max(v, what);
    std::copy(r.begin(), r.end(), values);
    return KEEL_OK;
  } catch (const std::exception& e) {
    if (err) std::snprintf(err->message, KEEL_ERROR_CAPACITY, "%s", e.what());
    return KEEL_ERR;
  }
}

}  // namespace keel
