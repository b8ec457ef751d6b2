// The option, declared once: the schema below lists it, the constructor reads it as the
// type it declares (ctx.get).
constexpr auto kPeakTflops = keel::opt_float(
    "peak_tflops", nullptr, "peak TFLOP/s of the whole job's hardware (all devices together)", 1e-9,
    keel::kInf);

// Model FLOPs utilisation against a fixed hardware peak: the achieved FLOP/s (the model's
// training FLOPs per sample times samples per second) divided by peak_tflops * 1e12. 0 when the
// model does not report its FLOPs.
class @{Class} final : public keel::Mfu {
 public:
  // Options arrive checked against kOptions below (peak_tflops is required).
  explicit @{Class}(const keel::Context& ctx) : peak_flops_(ctx.get(kPeakTflops) * 1e12) {}
  double compute(double flops_per_sample, double samples_per_second) override {
    if (flops_per_sample == 0.0) return 0.0;
    return flops_per_sample * samples_per_second / peak_flops_;
  }

 private:
  double peak_flops_;
};

// The option schema: what `keel plugins show @{component}` lists and a manifest may set.
const keel_option_desc kOptions[] = {kPeakTflops};
const keel_component_desc kComponents[] = {
    keel::component<@{Class}>("@{component}", "@{summary}", kOptions),
};
