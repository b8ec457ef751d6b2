#include "run/parameters.hpp"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "config/keys.hpp"
#include "distributed/residency.hpp"
#include "distributed/sharding.hpp"
#include "host.hpp"
#include "keel/tensor.hpp"
#include "run/run.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// The index in `tensors` of a tensor that is `t` (the same TensorImpl, or a view of the same
// storage with the same offset, sizes, strides and dtype), or -1.
int64_t same_tensor_as(const std::vector<at::Tensor>& tensors, const at::Tensor& t) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& u = tensors[i];
    if (u.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int64_t>(i);
    if (u.has_storage() && t.has_storage() && u.storage().is_alias_of(t.storage()) &&
        u.storage_offset() == t.storage_offset() && u.sizes() == t.sizes() &&
        u.strides() == t.strides() && u.dtype() == t.dtype())
      return static_cast<int64_t>(i);
  }
  return -1;
}

// The model's parameters (for the optimizer and clipper), each once.
void collect_parameters(Run& run) {
  const Instance<keel_model>& model = run.components.model;
  Parameters& p = run.parameters;
  const size_t count = model.get("param_count", model->param_count);
  if (count == 0) throw model.error("param_count returned 0: the model has no trainable parameters");
  std::set<std::string> seen;
  for (size_t i = 0; i < count; ++i) {
    const auto [name, t] = named_entry(model, "param", model->param, i);
    const std::string what = "param(" + std::to_string(i) + ")";
    const std::string n(name);  // terminated within KEEL_NAME_CAPACITY (named_entry)
    if (!seen.insert(n).second)
      throw model.error(fmt::format("duplicate parameter name '{}' (param {}); every parameter "
                                    "needs its own name", n, i));
    const at::Tensor tensor = borrow(t);
    if (!tensor.is_floating_point() || !tensor.requires_grad())
      throw model.error(what + " '" + n + "' is not a floating-point tensor that requires "
                        "grad; parameters are the tensors the optimizer trains");
    // A parameter shared between modules (weight tying: lm_head.weight is wte.weight) is
    // trained, counted and saved once, under its first name (said in run.log: the model's
    // design, the same on every run).
    if (const int64_t first = same_tensor_as(p.tensors, tensor); first >= 0) {
      spdlog::debug("{}: parameter '{}' is '{}' (shared): trained and saved once, as '{}'",
                   model.label(), n, p.names[first], p.names[first]);
      continue;
    }
    p.names.push_back(name);
    p.model_index.push_back(i);
    p.handles.push_back(t);
    p.tensors.push_back(tensor);
  }
}

// The model's state (for checkpoints), each tensor once.
void collect_model_state(Run& run) {
  const Instance<keel_model>& model = run.components.model;
  const size_t count = model.get("state_count", model->state_count);
  std::set<std::string> seen;
  std::vector<at::Tensor> tensors;
  for (size_t i = 0; i < count; ++i) {
    const keel_named_tensor nt = named_entry(model, "state", model->state, i);
    if (!seen.insert(nt.name).second)
      throw model.error("duplicate state name '" + std::string(nt.name) + "'");
    if (same_tensor_as(tensors, borrow(nt.tensor)) >= 0) continue;  // shared: saved once
    tensors.push_back(borrow(nt.tensor));
    run.parameters.model_state.push_back(nt);
  }
}

// shard = "parameters": the unit of each parameter (model_units's first; -1: the root) from
// the model's param_unit (ABI 1.8), and the number of units; a model without them is all root,
// with a warning.
struct ModelUnits {
  std::vector<int32_t> unit_of;
  int32_t units = 0;
};
ModelUnits model_units(const Run& run) {
  const Instance<keel_model>& model = run.components.model;
  const Parameters& p = run.parameters;
  const bool has_unit = KEEL_HAS_SLOT(model, keel_model, param_unit);
  if (has_unit != KEEL_HAS_SLOT(model, keel_model, set_unit_calls))
    throw model.error(std::string("has ") + (has_unit ? "param_unit" : "set_unit_calls") +
                      " without " + (has_unit ? "set_unit_calls" : "param_unit") +
                      " (ABI 1.8 units: both or neither)");
  ModelUnits m;
  if (!has_unit) {
    spdlog::warn("{}: declares no units (ABI 1.8 param_unit): distributed.shard = "
                 "\"parameters\" gathers the whole model as one unit for each micro-batch, "
                 "saving optimizer and gradient memory but not parameter memory", model.label());
    m.unit_of.assign(p.tensors.size(), -1);
    return m;
  }
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const size_t index = p.model_index[i];
    const int32_t u = model.get("param_unit", model->param_unit, index);
    if (u < -1 || u >= KEEL_MAX_UNITS)
      throw model.error(fmt::format("param_unit({}) returned {} for parameter '{}'; a unit is -1 "
                                    "(the root) or 0 <= unit < {}", index, u, p.names[i],
                                    KEEL_MAX_UNITS));
    m.unit_of.push_back(u);
    m.units = std::max(m.units, u + 1);
  }
  return m;
}

}  // namespace

keel_create_context context(const Run& run, const ComponentSpec& spec) {
  keel_create_context c{};
  c.struct_size = sizeof(c);
  c.host = host();
  c.options = &spec.options;
  c.section = spec.section.c_str();
  c.seed = run.config.run.seed;
  c.rank = run.ranks.rank;
  c.world_size = run.ranks.world;
  c.run_dir = run.directory.path.c_str();
  c.resume_step = run.resume.active() ? run.resume.meta.step : 0;
  c.comm = run.comm ? run.comm->abi() : nullptr;  // set by join_ranks (run/assemble.cpp)
  c.device = run.ranks.device_name.c_str();
  return c;
}

keel_create_context param_context(const Run& run, const ComponentSpec& spec) {
  keel_create_context c = context(run, spec);
  c.params = run.parameters.handles.data();
  c.param_names = run.parameters.names.data();
  c.param_count = run.parameters.handles.size();
  return c;
}

keel_create_context update_context(const Run& run, const ComponentSpec& spec) {
  keel_create_context c = param_context(run, spec);
  if (run.shards) {
    c.params = run.shards->handles().data();
    c.shards = run.shards->abi_group();
  }
  return c;
}

void create_model(Run& run) {
  Instance<keel_model>& model = run.components.model;
  model = make_instance<keel_model>(run, run.config.model);
  run.components.model_calls = with_batches(model);
  collect_parameters(run);
  collect_model_state(run);
  const at::Device& device = run.ranks.device;
  if (!device.is_cpu()) {
    // Parameters and buffers move in place (same tensors, new storage), like Module::to.
    const at::NoGradGuard no_grad;
    for (const auto& nt : run.parameters.model_state)
      borrow(nt.tensor).set_data(borrow(nt.tensor).to(device));
    for (at::Tensor& p : run.parameters.tensors)
      if (p.device() != device) p.set_data(p.to(device));
  }
  run.plan.flops_per_sample = model.get("flops_per_sample", model->flops_per_sample);
  if (!std::isfinite(run.plan.flops_per_sample) || run.plan.flops_per_sample < 0)
    throw model.error("flops_per_sample returned " + text::number(run.plan.flops_per_sample) +
                      "; it must be >= 0 (0: unknown)");
}

ParamGroups assign_param_groups(const Run& run) {
  const std::vector<const char*>& names = run.parameters.names;
  ParamGroups groups;
  groups.of_param.assign(names.size(), 0);
  groups.lr.assign(1, NAN);
  groups.weight_decay.assign(1, NAN);
  for (size_t g = 0; g < run.config.param_groups.size(); ++g) {
    const ParamGroupSpec& spec = run.config.param_groups[g];
    const std::regex re(spec.params);
    size_t matched = 0;
    for (size_t i = 0; i < names.size(); ++i)
      if (groups.of_param[i] == 0 && std::regex_match(names[i], re)) {
        groups.of_param[i] = static_cast<int32_t>(g + 1);
        ++matched;
      }
    if (matched == 0) {
      const std::string listed = text::join(names);
      throw Error(fmt::format("{}: optimizer.groups[{}].params = \"{}\" matches no parameter not "
                              "already in an earlier group (parameters: {}); hint: the regex must "
                              "match whole names", spec.where, g, spec.params, listed));
    }
    groups.lr.push_back(spec.lr);
    groups.weight_decay.push_back(spec.weight_decay);
  }
  return groups;
}

void shard_parameters(Run& run) {
  const DistributedKeys& d = run.config.distributed;
  if (d.shard == ShardMode::kNone) return;
  const std::string value =
      "\"" + std::get<std::string>(distributed_keys().find("shard")->read(d)) + "\"";
  if (!run.ranks.group) {
    spdlog::warn("distributed.shard = {} with one process: every parameter is whole here, so "
                 "the run holds everything as with \"none\" (under a launcher, e.g. torchrun "
                 "--nproc_per_node=1, keel forms a group of one and shards over it)", value);
    return;
  }
  const bool fsdp = d.shard == ShardMode::kParameters;
  std::vector<at::Tensor> state;
  for (const auto& nt : run.parameters.model_state) state.push_back(borrow(nt.tensor));
  const std::vector<std::string> names(run.parameters.names.begin(), run.parameters.names.end());
  const auto [unit_of, units] = fsdp ? model_units(run) : ModelUnits{};
  run.shards = std::make_unique<ShardedParams>(
      *run.ranks.group, run.parameters.tensors, names, state, d.bucket_cap_mb << 20,
      fsdp ? ShardedParams::Mode::kParameters
           : d.shard == ShardMode::kGradients ? ShardedParams::Mode::kGradients
                                              : ShardedParams::Mode::kOptimizer,
      Residency::groups_of(unit_of, units));
  spdlog::info("distributed.shard = {}: {}", value, run.shards->describe());
  if (!fsdp) return;
  run.residency = std::make_unique<Residency>(run.ranks.group->collectives(), *run.shards,
                                              unit_of, units);
  const Instance<keel_model>& model = run.components.model;
  if (units > 0) model.run("set_unit_calls", model->set_unit_calls, run.residency->abi_calls());
  spdlog::info("distributed.shard = {}: {}", value, run.residency->describe());
}

}  // namespace keel
