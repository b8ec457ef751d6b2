// plugin_probes: the probes of this folder in one executable, so that LibTorch's headers are
// parsed once for all of them (a unity build of one target) instead of once per probe. Each
// probe keeps its file and namespace, with `entry` for its main. meson.build makes each probe's
// name a symbolic link to this executable; main runs the probe its argv[0] names, or argv[1]'s
// when started as plugin_probes itself (`plugin_probes gpt_probe ARGS...`).
#include <cstdio>
#include <cstring>
#include <string>

namespace tokens_dump { int entry(int argc, char** argv); }
namespace lm_losses_probe { int entry(int argc, char** argv); }
namespace gpt_probe { int entry(int argc, char** argv); }
namespace gpt_units_probe { int entry(int argc, char** argv); }
namespace torch_profiler_probe { int entry(int argc, char** argv); }
namespace ctr_probe { int entry(int argc, char** argv); }

int main(int argc, char** argv) {
  static const struct {
    const char* name;
    int (*entry)(int argc, char** argv);
  } kProbes[] = {{"tokens_dump", tokens_dump::entry},
                 {"lm_losses_probe", lm_losses_probe::entry},
                 {"gpt_probe", gpt_probe::entry},
                 {"gpt_units_probe", gpt_units_probe::entry},
                 {"torch_profiler_probe", torch_profiler_probe::entry},
                 {"ctr_probe", ctr_probe::entry}};
  const char* slash = std::strrchr(argv[0], '/');
  std::string name = slash ? slash + 1 : argv[0];
  if (name == "plugin_probes" && argc > 1) {
    name = argv[1];
    ++argv;
    --argc;
  }
  std::string names;
  for (const auto& p : kProbes) {
    if (name == p.name) return p.entry(argc, argv);
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  std::fprintf(stderr, "plugin_probes: no probe named '%s'; hint: one of %s\n", name.c_str(),
               names.c_str());
  return 2;
}
