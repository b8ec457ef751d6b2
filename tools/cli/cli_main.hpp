// keel's command line as a function: what the `keel` executable runs (kernel/main.cpp), and what
// the in-process test runner (tests/cli/keel_inproc.cpp) calls once per case.
#pragma once

namespace keel {

// Runs one keel command line (argv[0] is the program name) and returns its exit status: 0
// success; 1 bad input or a failed run ("keel: error: ..."); 2 command-line usage; 128 + the
// signal for a run that SIGINT or SIGTERM stopped. Output goes to file descriptors 1 and 2 (C
// stdio; plugins, LibTorch and the console log write there too), flushed before it returns.
//
// An internal error (a bug in keel: an unexpected exception, std::terminate) ends the process
// with status 70 (EX_SOFTWARE) after one "keel: internal error: ..." line, as it does in the
// executable, and a second SIGINT/SIGTERM during training ends it with 128 + the signal.
//
// Process-global state a call changes is put back before it returns, so that the next call
// starts like a fresh process: the std::terminate handler and SIGXFSZ's disposition (set for the
// call), the console logger (level info, no rank tag, no run log, no messages kept for one),
// LibTorch's and OpenBLAS's thread counts. Left as the call set them: the glibc malloc tuning of
// [run] malloc_tuning (mallopt cannot be read back), LibTorch's random seed (every run sets it
// before use), the plugins loaded (dlopen handles and the descriptors the registry keeps for the
// life of the process, by design) and threads LibTorch's pools keep.
int cli_main(int argc, char** argv);

}  // namespace keel
