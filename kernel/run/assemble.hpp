// Assembly of a run (what Trainer's constructor does): every component created and checked, in
// dependency order, before step 1.
#pragma once

#include <optional>

#include "distributed/launch.hpp"
#include "run_config.hpp"

namespace keel {

struct Run;

// Assembles `run` from `config`; `launch`: the launcher's ranks (none: one process).
// `validate_only`: components get a scratch run directory, nothing is loaded into a resumed
// run and no run log is started. Throws keel::Error on the first problem.
void assemble(Run& run, const RunConfig& config, bool validate_only,
              const std::optional<Launch>& launch);

}  // namespace keel
