#include "distributed/residency.hpp"

#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <utility>

#include "distributed/collectives.hpp"
#include "distributed/sharding.hpp"
#include "error.hpp"
#include "keel/tensor.hpp"

namespace keel {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

void free_storage(const at::Tensor& t) { t.storage().unsafeGetStorageImpl()->reset(); }

void alloc_storage(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const size_t n = static_cast<size_t>(bytes_of(t));
  impl->set_data_ptr_noswap(impl->allocator()->allocate(n));
  impl->set_nbytes(n);
}

}  // namespace

std::vector<std::vector<size_t>> Residency::groups_of(const std::vector<int32_t>& unit_of,
                                                      int32_t units) {
  std::vector<std::vector<size_t>> groups;
  for (int32_t u = units; u-- > -1;) {  // units - 1, ..., 0, then the root (-1)
    std::vector<size_t> g;
    for (size_t i = unit_of.size(); i-- > 0;)  // reverse order, as backward produces them
      if (unit_of[i] == u) g.push_back(i);
    if (!g.empty()) groups.push_back(std::move(g));
  }
  return groups;
}

Residency::Residency(Collectives& collectives, ShardedParams& shards,
                     std::vector<int32_t> unit_of, int32_t units)
    : collectives_(collectives), shards_(shards), units_(units) {
  const std::vector<ShardedParams::Param>& params = shards.params();
  members_.resize(static_cast<size_t>(units) + 1);
  bytes_.assign(members_.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t s = slot(unit_of.at(i));
    members_[s].push_back(i);
    bytes_[s] += bytes_of(params[i].padded);
    home_bytes_ += bytes_of(params[i].home);
  }
  gathered_.assign(members_.size(), true);  // until start()
  active_.assign(members_.size(), false);
  for (const std::vector<size_t>& g : groups_of(unit_of, units))
    group_slot_.push_back(slot(unit_of.at(g.front())));
  shards.on_group_sent([this](size_t group) { group_sent(group); });
  calls_.struct_size = sizeof(calls_);
  calls_.host_data = this;
  calls_.enter = &Residency::enter;
  calls_.leave = &Residency::leave;
}

size_t Residency::slot(int32_t unit) const {
  return unit < 0 ? static_cast<size_t>(units_) : static_cast<size_t>(unit);
}

void Residency::start() {
  const at::NoGradGuard no_grad;
  for (const ShardedParams::Param& p : shards_.params()) {
    const int64_t n = p.count * p.row_numel;
    if (n > 0) p.home.narrow(0, 0, n).copy_(p.padded.narrow(0, p.begin * p.row_numel, n));
  }
  for (size_t s = 0; s < members_.size(); ++s) {
    for (size_t i : members_[s]) free_storage(shards_.params()[i].padded);
    gathered_[s] = false;
  }
  gathered_bytes_ = 0;
  pinned_ = false;
  peak_outside_ = peak_resident_ = home_bytes_;
}

void Residency::gather(size_t s, const std::string& what) {
  if (gathered_[s]) return;
  const std::vector<ShardedParams::Param>& params = shards_.params();
  const int world = collectives_.world();
  std::vector<at::Tensor> inputs;
  std::vector<std::vector<at::Tensor>> outputs(world);
  for (size_t i : members_[s]) {
    const ShardedParams::Param& p = params[i];
    alloc_storage(p.padded);
    const int64_t n = p.chunk * p.row_numel;
    inputs.push_back(p.home);
    for (int q = 0; q < world; ++q) outputs[q].push_back(p.padded.narrow(0, q * n, n));
  }
  gathered_[s] = true;
  gathered_bytes_ += bytes_[s];
  if (members_[s].empty()) return;
  issued_ += 1;
  shards_.count_issued();
  collectives_.all_gather(std::move(inputs), std::move(outputs), what).wait();
}

void Residency::release(size_t s) {
  if (!gathered_[s] || pinned_) return;
  sample();  // the peak includes the moment just before the free
  drop(s);
}

void Residency::drop(size_t s) {
  if (!gathered_[s]) return;
  for (size_t i : members_[s]) free_storage(shards_.params()[i].padded);
  gathered_[s] = false;
  gathered_bytes_ -= bytes_[s];
  if (active_[s]) {
    active_[s] = false;
    active_bytes_ -= bytes_[s];
  }
}

void Residency::sample() {
  if (pinned_) return;  // an evaluation or a save: not a step
  const int64_t root = gathered_[members_.size() - 1] ? bytes_.back() : 0;
  const int64_t resident = home_bytes_ + gathered_bytes_;
  peak_resident_ = std::max(peak_resident_, resident);
  peak_outside_ = std::max(peak_outside_, resident - active_bytes_ - root);
}

std::pair<double, double> Residency::take_peaks() {
  sample();
  const std::pair<double, double> out{peak_outside_ / 1048576.0, peak_resident_ / 1048576.0};
  peak_outside_ = peak_resident_ = 0;
  sample();
  return out;
}

void Residency::before_forward(const std::string& what) {
  if (pinned_) return;
  gather(members_.size() - 1, "gathering the root parameters for the " + what);
  sample();
}

void Residency::after_backward() {
  for (size_t s = 0; s < members_.size(); ++s) release(s);
}

void Residency::group_sent(size_t group) {
  const size_t s = group_slot_.at(group);
  if (s != members_.size() - 1) release(s);  // the root: after the backward (after_backward)
}

void Residency::pre_backward(size_t s) {
  if (!active_[s] && !pinned_) {
    gather(s, fmt::format("gathering unit {}'s parameters for its backward", s));
    active_[s] = true;
    active_bytes_ += bytes_[s];
  }
  sample();
}

void Residency::gather_all(const std::string& what) {
  pinned_ = true;
  for (size_t s = 0; s < members_.size(); ++s) gather(s, what);
}

void Residency::free_all() {
  for (size_t s = 0; s < members_.size(); ++s) drop(s);
  pinned_ = false;
}

std::string Residency::describe() const {
  int32_t with = 0;
  for (int32_t u = 0; u < units_; ++u) with += members_[static_cast<size_t>(u)].empty() ? 0 : 1;
  return fmt::format("{} unit(s) with parameters and a root of {:.2f} MiB (whole); this rank "
                     "holds {:.2f} MiB of parameter rows between uses",
                     with, bytes_.back() / 1048576.0, home_bytes_ / 1048576.0);
}

keel_status Residency::enter(const keel_unit_calls* calls, int32_t unit, keel_error* err) {
  try {
    auto* self = static_cast<Residency*>(calls->host_data);
    if (unit < 0 || unit >= self->units_)
      throw Error(fmt::format("enter({}): the model declared units 0..{} (param_unit)", unit,
                              self->units_ - 1));
    if (self->entered_ != -2)
      throw Error(fmt::format("enter({}) inside unit {}, which was not left; units do not nest",
                              unit, self->entered_));
    const size_t s = self->slot(unit);
    self->entered_ = unit;
    if (self->pinned_) return KEEL_OK;
    self->gather(s, fmt::format("gathering unit {}'s parameters for its forward", unit));
    if (!self->active_[s]) {
      self->active_[s] = true;
      self->active_bytes_ += self->bytes_[s];
    }
    self->sample();
    return KEEL_OK;
  } catch (const std::exception& e) {
    if (err) std::snprintf(err->message, KEEL_ERROR_CAPACITY, "%s", e.what());
    return KEEL_ERR;
  }
}

keel_status Residency::leave(const keel_unit_calls* calls, int32_t unit,
                             keel_tensor* const* outputs, size_t count, keel_error* err) {
  try {
    auto* self = static_cast<Residency*>(calls->host_data);
    if (unit != self->entered_)
      throw Error(self->entered_ == -2
                      ? fmt::format("leave({}) without enter", unit)
                      : fmt::format("leave({}) inside unit {}", unit, self->entered_));
    self->entered_ = -2;
    const size_t s = self->slot(unit);
    if (self->pinned_) return KEEL_OK;
    if (c10::GradMode::is_enabled())
      for (size_t i = 0; i < count; ++i) {
        const at::Tensor t = borrow(outputs[i]);
        if (!t.defined() || !t.requires_grad()) continue;
        t.register_hook([self, s](const at::Tensor&) { self->pre_backward(s); });
      }
    self->release(s);
    return KEEL_OK;
  } catch (const std::exception& e) {
    if (err) std::snprintf(err->message, KEEL_ERROR_CAPACITY, "%s", e.what());
    return KEEL_ERR;
  }
}

}  // namespace keel
