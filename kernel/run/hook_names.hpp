// How a run's hooks are named in their log lines. The SDK's Logger logs under the component's
// section ("hooks[3]", a position in the manifest); the kernel hands hooks a host whose log
// names such a line by the hook's label instead ("[stopper] stopping: ...", the label the user
// gave it, else its type), when that label is one hook's alone among the run's hooks (two
// unlabelled jsonl sinks keep "[hooks[1]]" and "[hooks[2]]"). Errors keep the section, which
// points into the manifest.
#pragma once

#include <vector>

#include "keel/abi.h"
#include "run_config.hpp"

namespace keel {

// Sets the names of this run's hooks (replacing those of an earlier run in this process) and
// returns the host to create them with. keel_host.log carries no context, so the names live in
// one process-wide table, read under a lock.
const keel_host* hook_host(const std::vector<ComponentSpec>& hooks);

}  // namespace keel
