#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kBatchSize = keel::opt_int("batch_size", "32", "samples per batch", 1, 1e6);

// 256 points on a 16 x 16 grid in [-1, 1]^2: inputs [x, y] (float32), target 1 where x * y > 0,
// else 0 (int64). Each epoch visits them in an order shuffled from the run's seed and the epoch
// alone, so a resumed run sees the same batches. With several ranks, rank r takes every
// world_size-th sample of that order from position r: 256 / world_size samples each (rounded
// down). Batches hold batch_size samples, the last of an epoch the rest.
class @{Class} final : public keel::Dataset {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx)
      : batch_size_(ctx.get(kBatchSize)),
        seed_(ctx.seed()),
        rank_(ctx.rank()),
        world_size_(ctx.world_size()) {
    const at::Tensor c = (at::arange(16, at::kFloat) * 2 + 1) / 16 - 1;  // grid coordinates
    inputs_ = at::stack({c.repeat({16}), c.repeat_interleave(16)}, 1);  // sample s: [c[s%16], c[s/16]]
    targets_ = (inputs_.select(1, 0) * inputs_.select(1, 1) > 0).to(at::kLong);
    start_epoch(0);
  }
  int64_t size() override { return kSamples / world_size_; }
  int64_t batches_per_epoch() override { return (size() + batch_size_ - 1) / batch_size_; }
  void start_epoch(int64_t epoch) override {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ * 1000003u + epoch);
    order_ = at::randperm(kSamples, gen)
                 .slice(0, rank_, rank_ + size() * world_size_, world_size_);  // this rank's share
    cursor_ = 0;
  }
  bool next(keel::Batch& out) override {
    if (cursor_ >= order_.size(0)) return false;  // the end of the epoch
    const at::Tensor index = order_.slice(0, cursor_, cursor_ + batch_size_);
    cursor_ += index.size(0);
    out.inputs = inputs_.index_select(0, index);
    out.targets = targets_.index_select(0, index);
    out.samples = out.tokens = index.size(0);
    return true;
  }

 private:
  static constexpr int64_t kSamples = 256;
  int64_t batch_size_;
  uint64_t seed_;
  int64_t rank_, world_size_;
  at::Tensor inputs_, targets_, order_;  // order_: this epoch's sample indices for this rank
  int64_t cursor_ = 0;                   // position in order_
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kBatchSize};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
