// Assembly of a run (what Trainer's constructor does): every component created and checked, in
// dependency order, before step 1.
#pragma once

#include <optional>

#include "distributed/launch.hpp"
#include "run_config.hpp"

namespace keel {

struct Run;

// Assembles `run` from `config`; `launch`: the launcher's ranks (none: one process).
// `validate_only`: components get a scratch run directory, a --resume checkpoint is read and
// checked as a resume would (no event announces it), the run directory's files are checked
// instead of written (run_directory.hpp: check_run_files) and no run log is started. Throws
// keel::Error on the first problem.
void assemble(Run& run, const RunConfig& config, bool validate_only,
              const std::optional<Launch>& launch);

}  // namespace keel
