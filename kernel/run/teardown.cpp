// The teardown order (teardown.hpp). Read kTeardown top to bottom: what goes first, and why
// each part must outlive those above it (its `needs`); check_teardown_order keeps the two
// consistent (tests/unit/test_loop.cpp).
#include "run/teardown.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "run/run.hpp"

namespace keel {

namespace {

template <class T>
void clear(T& part) {
  part = T();
}

// A component instance holds the components' keel_comm (its creation context) until it goes.
constexpr const char* kComm = "components' comm";

const std::vector<TeardownPart> kTeardown = {
    // They borrow the gradient synchronisation, the shards and the residency.
    {"step modes", [](Run& r) { clear(r.step_modes); },
     {"gradient synchronisation", "shards", "residency"}},
    // Its autograd hooks hold the model's parameters; its buckets reduce over the group.
    {"gradient synchronisation", [](Run& r) { r.grad_sync.reset(); }, {"model", "process group"}},
    // The components, in reverse order of creation: [step] and its frozen [models.NAME] last.
    {"step", [](Run& r) { clear(r.components.own_step); }, {kComm, "run directory"}},
    {"hooks",
     [](Run& r) {
       r.components.observers = Observers();
       r.components.hooks.clear();
     },
     {kComm, "run directory", "model views"}},
    // Borrow the model's tensors.
    {"model views", [](Run& r) { r.components.model_views.reset(); }, {"model"}},
    // Writes with the backend (an asynchronous save's writer shares the ranks' store client).
    {"checkpoint store", [](Run& r) { r.components.store.reset(); },
     {"checkpoint backend", "process group", "run directory"}},
    {"checkpoint backend", [](Run& r) { r.components.backend.reset(); }, {"checkpoint"}},
    {"checkpoint", [](Run& r) { clear(r.components.checkpoint); }, {kComm}},
    {"profiler", [](Run& r) { clear(r.components.profiler); }, {kComm, "run directory"}},
    {"mfu", [](Run& r) { clear(r.components.mfu); }, {kComm}},
    // Borrows this rank's shards (keel_create_context.shards).
    {"clipper", [](Run& r) { clear(r.components.clipper); }, {kComm, "shards"}},
    {"evaluation metrics", [](Run& r) { clear(r.components.eval_metrics); }, {"loss"}},
    {"loss", [](Run& r) { clear(r.components.loss); }, {kComm}},
    {"scheduler", [](Run& r) { clear(r.components.scheduler); }, {kComm}},
    // Updates the model's sparse tables.
    {"sparse optimizer", [](Run& r) { clear(r.components.sparse_optimizer); }, {kComm, "model"}},
    // Borrows this rank's shards.
    {"optimizer", [](Run& r) { clear(r.components.optimizer); }, {kComm, "shards"}},
    {"data", [](Run& r) {
       r.components.eval_sets.clear();
       clear(r.components.train_data);
     },
     {kComm}},
    // Calls the residency (shard = "parameters": enter and leave its units).
    {"model", [](Run& r) { clear(r.components.model); }, {kComm, "residency"}},
    // Holds the shards (their storage is what it gathers into and frees).
    {"residency", [](Run& r) { r.residency.reset(); }, {"shards"}},
    {"shards", [](Run& r) { r.shards.reset(); }, {"process group"}},
    {kComm, [](Run& r) { r.comm.reset(); }, {"process group"}},
    {"process group", [](Run& r) {
       r.ranks.writer_store.reset();
       r.ranks.group.reset();
     },
     {}},
    {"run log", [](Run& r) { r.directory.run_log.detach(); }, {"run directory"}},
    // `keel validate`'s scratch directory, where its components wrote.
    {"scratch directory", [](Run& r) { r.directory.scratch.remove(); }, {}},
    {"run directory", [](Run& r) { r.directory.dir.reset(); }, {}},
};

}  // namespace

const std::vector<TeardownPart>& teardown_order() { return kTeardown; }

std::string check_teardown_order(const std::vector<TeardownPart>& order) {
  const auto position = [&](const std::string& name) {
    return std::find_if(order.begin(), order.end(),
                        [&](const TeardownPart& p) { return p.name == name; }) -
           order.begin();
  };
  for (size_t i = 0; i < order.size(); ++i)
    for (const char* needed : order[i].needs) {
      const auto at = static_cast<size_t>(position(needed));
      if (at == order.size())
        return std::string(order[i].name) + " needs " + needed + ", which is not a part";
      if (at < i)
        return std::string(order[i].name) + " is released after " + needed + ", which it needs";
    }
  return "";
}

void teardown(Run& run) {
  for (const TeardownPart& part : kTeardown) part.release(run);
}

Run::~Run() { teardown(*this); }

}  // namespace keel
