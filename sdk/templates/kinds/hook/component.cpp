#include <string>

// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kTargetLoss = keel::opt_float(
    "target_loss", "0.0", "stop once a step's training loss is below this (0: never)", 0.0,
    keel::kInf);

// Stops the run at the first step whose training loss falls below target_loss (0: never).
class @{Class} final : public keel::Hook {
 public:
  // Options arrive checked against kOptions below, with defaults filled in.
  explicit @{Class}(const keel::Context& ctx)
      : target_loss_(ctx.get(kTargetLoss)), log_(ctx) {}
  // Sees every event of the run (abi.h lists them in order); acts on STEP_END only.
  void on_event(keel_event& event) override {
    if (event.kind != KEEL_EVENT_STEP_END || !(target_loss_ > 0)) return;
    if (!(event.state->loss < target_loss_)) return;
    event.requests |= KEEL_REQUEST_STOP;  // the kernel ends the run after this step
    log_(KEEL_LOG_INFO, "step " + std::to_string(event.state->step) + ": loss " +
                            std::to_string(event.state->loss) + " is below target_loss " +
                            std::to_string(target_loss_) + ", stopping");
  }

 private:
  double target_loss_;
  keel::Logger log_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kTargetLoss};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
