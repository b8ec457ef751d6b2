// keel command line: train, validate, plugins, plugins show, --version.
#include <c10/util/Exception.h>
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "error.hpp"
#include "manifest.hpp"
#include "registry.hpp"
#include "run_config.hpp"
#include "trainer.hpp"

namespace po = boost::program_options;

namespace {

constexpr const char* kUsage =
    "usage: keel train MANIFEST [--set KEY=VALUE]...\n"
    "       keel evaluate MANIFEST [--set KEY=VALUE]...   (weights from [checkpoint] init_from)\n"
    "       keel validate MANIFEST [--set KEY=VALUE]...\n"
    "       keel plugins [show NAME]\n"
    "       keel --version | --help\n";

struct RunArgs {
  std::string manifest;
  std::vector<std::string> sets;
};

RunArgs parse_run_args(const std::vector<std::string>& args, const char* command) {
  po::options_description opts("options");
  opts.add_options()("set", po::value<std::vector<std::string>>()->composing(),
                     "override a manifest key: --set optimizer.lr=3e-4")(
      "manifest", po::value<std::string>(), "manifest file");
  po::positional_options_description pos;
  pos.add("manifest", 1);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(opts).positional(pos).run(), vm);
  RunArgs r;
  if (!vm.count("manifest"))
    throw po::error(std::string("`keel ") + command + "` needs a MANIFEST (a .toml file)");
  r.manifest = vm["manifest"].as<std::string>();
  if (vm.count("set")) r.sets = vm["set"].as<std::vector<std::string>>();
  return r;
}

keel::RunConfig load_config(const RunArgs& a, keel::Registry& registry) {
  const keel::Manifest m = keel::load_manifest(a.manifest, a.sets);
  return keel::resolve(m, registry);
}

int cmd_plugins(const std::vector<std::string>& args) {
  keel::Registry registry;
  const std::vector<std::string> searched = keel::plugin_search_path({});
  registry.discover(searched);
  if (!args.empty() && args[0] == "show") {
    if (args.size() != 2) throw po::error("usage: keel plugins show NAME");
    bool found = false;
    for (const auto& c : registry.components()) {
      if (c->name != args[1] && c->plugin->descriptor->name != args[1]) continue;
      found = true;
      std::printf("%s %s  (plugin %s %s, %s)\n  %s\n", keel::kind_name(c->kind), c->name.c_str(),
                  c->plugin->descriptor->name, c->plugin->descriptor->version,
                  c->plugin->path.c_str(), c->description.c_str());
      if (c->options.empty()) std::printf("  (no options)\n");
      for (const auto& o : c->options)
        std::printf("  %-16s %-34s default %-12s %s\n", o.key, keel::describe(o).c_str(),
                    o.default_toml ? o.default_toml : "(required)", o.help ? o.help : "");
      std::printf("\n");
    }
    if (!found) {
      std::vector<std::string> names;
      for (const auto& c : registry.components()) names.push_back(c->name);
      const std::string near = keel::closest(args[1], names);
      throw keel::Error("no plugin or component named '" + args[1] + "'" +
                        (near.empty() ? "" : "; did you mean '" + near + "'?") +
                        " (hint: `keel plugins` lists everything found)");
    }
    return 0;
  }
  if (!args.empty()) throw po::error("unknown argument '" + args[0] + "' to `keel plugins`");
  std::printf("%-13s %-16s %-18s %-8s %-5s %s\n", "KIND", "NAME", "PLUGIN", "VERSION", "ABI",
              "PATH");
  for (const auto& c : registry.components()) {
    const keel_plugin_descriptor* d = c->plugin->descriptor;
    const std::string abi = std::to_string(d->abi_major) + "." + std::to_string(d->abi_minor);
    std::printf("%-13s %-16s %-18s %-8s %-5s %s\n", keel::kind_name(c->kind), c->name.c_str(),
                d->name, d->version, abi.c_str(), c->plugin->path.c_str());
  }
  if (!registry.refusals().empty()) std::printf("\nrefused:\n");
  for (const auto& r : registry.refusals())
    std::printf("  %s: %s\n", r.path.c_str(), r.reason.c_str());
  std::printf("\nsearched: ");
  for (const auto& d : searched) std::printf("%s  ", d.c_str());
  std::printf("\n");
  return 0;
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("keel %s (plugin ABI %d.%d, LibTorch %s)\n", KEEL_VERSION, KEEL_ABI_MAJOR,
                KEEL_ABI_MINOR, keel::kernel_torch_version());
    return 0;
  }
  const std::string command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "plugins") return cmd_plugins(rest);
  if (command == "validate") {
    keel::Registry registry;
    const keel::RunConfig cfg = load_config(parse_run_args(rest, "validate"), registry);
    std::printf("%s: ok (run '%s' -> %s)\n", cfg.manifest_path.c_str(), cfg.name.c_str(),
                cfg.output_dir.c_str());
    return 0;
  }
  if (command == "train" || command == "evaluate") {
    RunArgs args = parse_run_args(rest, command.c_str());
    if (command == "evaluate") args.sets.push_back("run.mode=evaluate");
    keel::Registry registry;  // declared first: libraries outlive every instance
    const keel::RunConfig cfg = load_config(args, registry);
    keel::Trainer trainer(cfg);
    const keel::RunSummary s = trainer.train();
    if (cfg.mode == keel::RunMode::kEvaluate)
      spdlog::info("done: evaluation loss {:.4f}{}, run directory {}", s.eval_loss,
                   s.eval_accuracy >= 0 ? fmt::format(", accuracy {:.4f}", s.eval_accuracy) : "",
                   s.run_dir);
    else
      spdlog::info("done: {} steps, {} samples, run directory {}", s.steps, s.samples, s.run_dir);
    return 0;
  }
  throw po::error("unknown command '" + command + "'");
}

}  // namespace

int main(int argc, char** argv) {
  // On a terminal each log line first clears the line, so it replaces the console hook's
  // progress bar (which the hook redraws below it) instead of mixing with it.
  spdlog::set_pattern(isatty(fileno(stdout)) ? "\r\033[K[%T] %v" : "[%T] %v");
  try {
    return run(argc, argv);
  } catch (const po::error& e) {
    std::fprintf(stderr, "keel: error: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const keel::Error& e) {
    std::fprintf(stderr, "keel: error: %s\n", e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "keel: error: LibTorch: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keel: error: %s\n", e.what());
  }
  return 1;
}
