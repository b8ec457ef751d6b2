#include "distributed/grad_reduce.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <utility>

#include "error.hpp"

namespace keel {

GradReduceScatter::GradReduceScatter(Collectives& collectives, std::vector<Param> params,
                                     int64_t bucket_bytes)
    : collectives_(collectives), params_(std::move(params)) {
  // Buckets in reverse parameter order, each at most bucket_bytes of whole gradients.
  int64_t bytes = 0;
  bucket_of_.resize(params_.size());
  for (size_t i = params_.size(); i-- > 0;) {
    const int64_t b = params_[i].full.numel() * params_[i].full.element_size();
    if (buckets_.empty() || (bytes > 0 && bytes + b > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(i);
    bucket_of_[i] = buckets_.size() - 1;
    bytes += b;
  }
  hook_accumulators();
}

GradReduceScatter::GradReduceScatter(Collectives& collectives, std::vector<Param> params,
                                     std::vector<std::vector<size_t>> groups, std::string mode)
    : collectives_(collectives), params_(std::move(params)), mode_(std::move(mode)),
      buckets_(std::move(groups)) {
  bucket_of_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t i : buckets_[b]) bucket_of_[i] = b;
  hook_accumulators();
}

void GradReduceScatter::hook_accumulators() {
  waiting_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
  fired_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> acc =
        torch::autograd::impl::grad_accumulator(params_[i].full);
    hook_keys_.push_back(acc->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, i](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list&) {
              ready(i);
              return outputs;
            })));
    accumulators_.push_back(std::move(acc));
  }
}

GradReduceScatter::~GradReduceScatter() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradReduceScatter::ready(size_t param) {
  if (fired_[param]) return;  // a second gradient of the same parameter in one backward
  fired_[param] = true;
  waiting_[bucket_of_[param]] -= 1;
  while (next_ < buckets_.size() && waiting_[next_] == 0) launch(next_++);
}

void GradReduceScatter::launch(size_t bucket) {
  const int64_t world = collectives_.world();
  const std::vector<size_t>& members = buckets_[bucket];
  int64_t per_rank = 0;  // C: the bucket's elements for one rank
  for (size_t i : members) per_rank += params_[i].chunk * params_[i].row_numel;
  const at::NoGradGuard no_grad;
  const at::Tensor& first = params_[members.front()].full;
  at::Tensor packed = at::empty({world * per_rank}, first.options().requires_grad(false));
  std::vector<at::Tensor> out;
  int64_t offset = 0;
  for (size_t i : members) {
    Param& p = params_[i];
    const at::Tensor g = p.full.grad().reshape({-1});
    const int64_t n = p.chunk * p.row_numel;
    for (int64_t q = 0; q < world; ++q) {
      const int64_t begin = std::min(q * p.chunk, p.rows), end = std::min((q + 1) * p.chunk, p.rows);
      at::Tensor dest = packed.narrow(0, q * per_rank + offset, n);
      const int64_t have = (end - begin) * p.row_numel;
      if (have > 0) dest.narrow(0, 0, have).copy_(g.narrow(0, begin * p.row_numel, have));
      if (have < n) dest.narrow(0, have, n - have).zero_();
    }
    p.full.mutable_grad().reset();  // sent: the whole gradient is not needed any more
    out.push_back(p.accum);
    offset += n;
  }
  if (on_sent) on_sent(bucket);
  issued_ += 1;
  pending_.push_back(collectives_.reduce_scatter(
      packed, std::move(out), static_cast<double>(world), /*accumulate=*/true,
      "reduce-scattering gradient bucket " + std::to_string(bucket)));
  // At most two buckets in flight: waiting for the older one frees its packed and received
  // buffers (each as large as the bucket's gradients) while backward goes on, instead of
  // holding every bucket's until the end of backward.
  while (pending_.size() > 2) {
    pending_.front().wait();
    pending_.erase(pending_.begin());
  }
}

void GradReduceScatter::finish_backward(const std::string& what) {
  for (size_t i = 0; i < params_.size(); ++i)
    if (!fired_[i])
      throw Error(what + ": parameter '" + params_[i].name + "' got no gradient; "
                  "distributed.shard = \"" + mode_ + "\" needs one for every parameter in "
                  "every backward (no unused parameters); hint: use distributed.shard = "
                  "\"optimizer\"");
  for (Pending& p : pending_) p.wait();
  pending_.clear();
  next_ = 0;
  fired_.assign(params_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].size();
}

}  // namespace keel
