#include "run/own_step.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <exception>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/commit.hpp"
#include "checkpoint/reshard.hpp"
#include "keel/tensor.hpp"
#include "run/named_tensors.hpp"
#include "run/parameters.hpp"
#include "run/resume.hpp"
#include "run/run.hpp"
#include "text/text.hpp"

namespace keel {

namespace {

// A set a step made, as tensors, under the rules a writer's entries follow (keel/ext/tensors.h:
// unique, non-empty, bounded names, no NULL tensor, at most KEEL_MAX_NAMED_TENSORS; checked by
// TensorWriter's put); throws naming the rule it breaks.
Named read_set(const keel_tensor_set* set) {
  if (set == nullptr) throw Error("the batch is NULL");
  if (set->struct_size < sizeof(keel_tensor_set))
    throw Error(fmt::format("the batch's struct_size {} is smaller than keel_tensor_set's {}",
                            set->struct_size, sizeof(keel_tensor_set)));
  if (set->count == 0 || set->count > KEEL_MAX_NAMED_TENSORS || !set->names || !set->tensors)
    throw Error(fmt::format("the batch holds {} tensors (names {}, tensors {}); a batch holds 1 "
                            "to {}", set->count, set->names ? "set" : "NULL",
                            set->tensors ? "set" : "NULL", KEEL_MAX_NAMED_TENSORS));
  TensorWriter entries;
  for (size_t i = 0; i < set->count && entries.refusal.empty(); ++i)
    entries.abi.put(&entries.abi, set->names[i], set->tensors[i]);
  if (!entries.refusal.empty()) throw Error("the batch: " + text::printable(entries.refusal));
  return std::move(entries.tensors);
}

// What a step's compute gets: its services, and the outputs lent to it until compute returns.
struct Services {
  keel_step_services abi{};
  Run* run = nullptr;
  const MicroBatch* mb = nullptr;
  std::deque<Named> outputs;
  std::deque<LentSet> lent;  // over `outputs`
};

// services.forward (keel/step.h): the outputs of [model] ("model") or a frozen [models.NAME].
keel_status services_forward(keel_step_services* s, const char* model,
                             const keel_tensor_set* batch, const keel_tensor_set** outputs,
                             keel_error* err) noexcept {
  std::string failure;
  try {
    if (outputs == nullptr) throw Error("forward: outputs is NULL");
    auto* sv = static_cast<Services*>(s->host_data);
    const Components& c = sv->run->components;
    const size_t len = model ? strnlen(model, KEEL_NAME_CAPACITY) : KEEL_NAME_CAPACITY;
    if (len == KEEL_NAME_CAPACITY)
      throw Error("forward: the model's name is NULL or not shorter than " +
                  std::to_string(KEEL_NAME_CAPACITY) + " bytes");
    const std::string name(model, len);
    MicroBatch mb;
    try {
      mb.tensors = read_set(batch);
    } catch (const Error& e) {
      throw Error(fmt::format("forward of '{}': {}", text::printable(name), e.what()));
    }
    mb.samples = sv->mb->samples;
    mb.tokens = sv->mb->tokens;
    mb.source = sv->mb->source;
    const at::Device& device = sv->run->ranks.device;
    for (const auto& [n, t] : mb.tensors) {
      const std::string problem =
          !t.defined()             ? "an undefined tensor"
          : t.dim() == 0           ? "a 0-dim tensor"
          : t.device() != device   ? "on " + t.device().str()
          : t.size(0) != mb.tensors.front().second.size(0)
              ? fmt::format("{} rows, and '{}' {}", t.size(0), mb.tensors.front().first,
                            mb.tensors.front().second.size(0))
              : "";
      if (!problem.empty())
        throw Error(fmt::format("forward of '{}': the batch's '{}' is {}; a model gets tensors "
                                "on the run's device ({}) whose first dimension is the batch, "
                                "the same in all", text::printable(name), n, problem,
                                device.str()));
    }
    if (name == "model") {
      sv->outputs.push_back(forward(c.model_calls, mb));
    } else {
      const FrozenModel* frozen = nullptr;
      std::vector<std::string> names = {"model"};
      for (const FrozenModel& m : c.own_step.models) {
        names.push_back(m.name);
        if (m.name == name) frozen = &m;
      }
      if (!frozen)
        throw Error(fmt::format("forward: no model '{}' in this run; hint: {}the run's models "
                                "are {} ([model] and each [models.NAME])", text::printable(name),
                                text::did_you_mean(name, names), text::join(names)));
      const at::NoGradGuard no_grad;  // frozen: no autograd graph
      sv->outputs.push_back(forward(frozen->calls, mb));
    }
    sv->lent.emplace_back(sv->outputs.back());
    *outputs = sv->lent.back().abi();
    return KEEL_OK;
  } catch (const Error& e) {
    failure = e.what();
  } catch (const c10::Error& e) {
    failure = e.what_without_backtrace();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "forward: an unknown exception";
  }
  if (err != nullptr) {
    std::strncpy(err->message, failure.c_str(), KEEL_ERROR_CAPACITY - 1);
    err->message[KEEL_ERROR_CAPACITY - 1] = '\0';
  }
  return KEEL_ERR;
}

// A [models.NAME]'s tensors from its init_from (a committed checkpoint, verified, read by the
// run's backend as init_from's are: run/init_from.cpp), then on the run's device, in
// evaluation mode, its parameters without requires_grad.
void load_frozen(Run& run, const FrozenModel& frozen, const NamedModelSpec& spec) {
  const Instance<keel_model>& model = frozen.model;
  const std::string& dir = spec.init_from;
  const std::string key = "models." + spec.name + ".init_from";
  if (KEEL_HAS_SLOT(model, keel_model, table_count) &&
      model.get("table_count", model->table_count) > 0)
    throw model.error("has sparse embedding tables, which a frozen model does not load (a "
                      "checkpoint holds their rows apart from the model's state); hint: a "
                      "[models.NAME] is a model without tables");
  if (!run.components.backend)
    throw Error(fmt::format("{}: reading checkpoint {} needs the run's [checkpoint] backend; "
                            "hint: add [checkpoint] with the type that saved it (e.g. type = "
                            "\"safetensors\")", key, dir));
  CommitRecord rec;
  try {
    rec = verify_checkpoint(dir);
  } catch (const Error& e) {
    throw Error(key + ": " + e.what());
  }
  TensorList into;
  std::set<const c10::TensorImpl*> seen;  // a tied tensor is saved once, under its first name
  const size_t count = model.get("state_count", model->state_count);
  for (size_t i = 0; i < count; ++i) {
    const keel_named_tensor nt = named_entry(model, "state", model->state, i);
    const at::Tensor t = borrow(nt.tensor);
    if (seen.insert(t.unsafeGetTensorImpl()).second) into.emplace_back(nt.name, t);
  }
  check_model_tensors(model.label(), rec, dir, into,
                      "point init_from at a checkpoint of a run whose [model] had this "
                      "model's type and options");
  std::vector<ChunkReader::Request> requests;
  for (const auto& [name, t] : into) requests.push_back({"model", name, 0, t});
  ChunkReader(*run.components.backend, dir, rec).read(requests);
  check_unchanged(dir, rec);  // the bytes loaded are the bytes verified
  // The state and the parameters (a parameter need not be among the state) on the run's
  // device, in place, as create_model moves [model]'s; the parameters without requires_grad.
  const at::Device& device = run.ranks.device;
  const at::NoGradGuard no_grad;
  for (const auto& [name, t] : into)
    if (t.device() != device) t.set_data(t.to(device));
  const size_t params = model.get("param_count", model->param_count);
  for (size_t i = 0; i < params; ++i) {
    const at::Tensor p = borrow(named_entry(model, "param", model->param, i).tensor);
    if (p.device() != device) p.set_data(p.to(device));
    p.requires_grad_(false);
  }
  model.run("set_training", model->set_training, 0);
  spdlog::info("{}: frozen, {} tensor(s) from {} (step {})", model.label(), into.size(), dir,
               rec.step);
}

}  // namespace

void create_own_step(Run& run) {
  const RunConfig& config = run.config;
  if (!config.step) return;
  OwnStep& own = run.components.own_step;
  // Creating the models and the step takes no random numbers from the run's CPU generator (the
  // models' initialisation is overwritten by init_from; created after a resume restored the
  // generators, a draw here would shift the resumed run's stream): its state is put back.
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const at::Tensor rng = gen.get_state();
  for (const NamedModelSpec& spec : config.models) {
    own.models.push_back({spec.name, make_instance<keel_model>(run, spec.model), {}});
    FrozenModel& frozen = own.models.back();
    frozen.calls = with_batches(frozen.model);
    load_frozen(run, frozen, spec);
  }
  own.step = make_instance<keel_step>(run, *config.step);
  gen.set_state(rng);
  if (run.plan.linear_loss)
    throw own.step.error(fmt::format("computes the training loss itself, and {} with {} would "
                                     "apply the output layer in the kernel's step instead "
                                     "(forward_features, compute_linear); hint: use a loss "
                                     "without compute_linear (token_cross_entropy)",
                                     run.components.loss.label(), run.components.model.label()));
  std::vector<std::string> names = {"model"};
  for (const FrozenModel& m : own.models) names.push_back(m.name);
  spdlog::info("{} computes each training micro-batch's loss, running {}; evaluation runs "
               "[model] and [loss]", own.step.label(), text::join(names));
}

at::Tensor own_step_loss(Run& run, const MicroBatch& mb) {
  const Instance<keel_step>& step = run.components.own_step.step;
  Services services;
  services.abi.struct_size = sizeof(keel_step_services);
  services.abi.host_data = &services;
  services.abi.forward = &services_forward;
  services.run = &run;
  services.mb = &mb;
  const LentSet batch(mb.tensors);
  keel_tensor* l = nullptr;
  step.call("compute", step->compute, &services.abi, batch.abi(), &l);
  const at::Tensor loss = adopt(l);
  if (!loss.defined()) throw step.error("compute returned no loss tensor (NULL)");
  if (loss.dim() != 0 || !loss.is_floating_point())
    throw step.error(fmt::format("compute returned a {} tensor of shape {}; a loss is a 0-dim "
                                 "floating-point tensor (the mean over the batch's items)",
                                 c10::toString(loss.scalar_type()), text::shape(loss.sizes())));
  if (!loss.requires_grad())
    throw step.error("compute returned a loss that does not require grad, so backward cannot "
                     "reach [model] (was it computed from a frozen model's outputs alone, or "
                     "detached?)");
  return loss;
}

}  // namespace keel
