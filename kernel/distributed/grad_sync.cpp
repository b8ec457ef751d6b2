#include "distributed/grad_sync.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <tuple>
#include <vector>

#include "compat/torch.hpp"
#include "distributed/impl.hpp"

namespace keel {

namespace {
constexpr size_t kFirstBucketBytes = 1 << 20;  // torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
}

struct GradSync::Impl {
  ProcessGroup::Impl* group = nullptr;
  std::shared_ptr<c10d::Reducer> reducer;
  int64_t buckets = 0;      // in the current layout (each all-reduced once per synced backward)
  int64_t all_reduces = 0;  // issued so far
};

GradSync::GradSync(ProcessGroup& group, const std::vector<at::Tensor>& params,
                   const std::vector<std::string>& names)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.group = &group.impl();
  const size_t cap = static_cast<size_t>(group.options().bucket_bytes);
  // As DistributedDataParallel._ddp_init_helper (torch 1.13): buckets by size in parameter
  // order, the first one small, then reversed to follow the order backward produces gradients.
  // (std::tie, not a structured binding: C++17 does not let the lambda below capture one.)
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> limits;
  std::tie(buckets, limits) = c10d::compute_bucket_assignment_by_size(
      params, {kFirstBucketBytes, cap}, std::vector<bool>(params.size(), false));
  std::reverse(buckets.begin(), buckets.end());
  std::reverse(limits.begin(), limits.end());
  s.buckets = static_cast<int64_t>(buckets.size());
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names[i] = names[i];
  s.group->guarded("creating the gradient reducer", [&] {
    // find_unused_parameters and gradient_as_bucket_view off, dense gradients.
    s.reducer = compat::make_reducer({params, buckets, limits, s.group->pg,
                                      static_cast<int64_t>(cap),
                                      static_cast<int64_t>(kFirstBucketBytes), param_names});
  });
}

GradSync::~GradSync() = default;

void GradSync::before_forward() {
  bool rebuilt = false;
  impl_->group->guarded("rebuilding gradient buckets", [&] {
    rebuilt = impl_->reducer->rebuild_buckets();
    impl_->reducer->prepare_for_forward();
  });
  // Once, after the first step: buckets in the order that backward produced the gradients.
  if (!rebuilt) return;
  impl_->buckets = static_cast<int64_t>(impl_->reducer->get_grad_buckets().size());
  // Every rank rebuilds the same buckets: rank 0 says so, the others in debug detail.
  spdlog::log(impl_->group->launch.rank == 0 ? spdlog::level::info : spdlog::level::debug,
              "gradient buckets rebuilt in backward's order: {}", describe());
}

void GradSync::before_backward(const at::Tensor& loss) {
  impl_->group->guarded("preparing the gradient all-reduce",
                        [&] { impl_->reducer->prepare_for_backward({loss}); });
  impl_->all_reduces += impl_->buckets;
}

int64_t GradSync::all_reduces() const { return impl_->all_reduces; }

std::string GradSync::describe() const {
  std::vector<double> mib;
  const std::vector<c10d::GradBucket> buckets = impl_->reducer->get_grad_buckets();
  for (const auto& b : buckets)
    mib.push_back(b.getBuffer().numel() * b.getBuffer().element_size() / 1048576.0);
  return fmt::format("{} bucket(s) of {:.2f} MiB, in the order they are all-reduced",
                     buckets.size(), fmt::join(mib, ", "));
}

}  // namespace keel
