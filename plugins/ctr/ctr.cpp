// keel-ctr: a click-through-rate model (dlrm, dlrm.cpp) and its loss (bce, bce.cpp), built
// against the SDK alone (keel-sdk and keel-embedding), as a third party would build them.
#include "components.hpp"
#include "keel/plugin.hpp"

namespace {

const keel_component_desc kComponents[] = {
    keel_ctr::dlrm_component(),
    keel_ctr::bce_component(),
};

}  // namespace

KEEL_PLUGIN("keel-ctr", "0.1.0",
            "Click-through-rate model (DLRM with hash-table embeddings) and its loss (binary "
            "cross-entropy with exact AUC)",
            kComponents)
