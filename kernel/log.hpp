// Logging: the console (stdout) at the level chosen with --log-level / KEEL_LOG_LEVEL, and
// run.log in the run directory, which holds everything the console shows plus debug detail.
//
// Both are sinks of spdlog's default logger, so spdlog::info(...) anywhere in the kernel (and
// a plugin's keel_host::log) reaches both. Messages logged before a run log is attached (the
// command line, manifest and plugin discovery) are kept in memory and written at the top of
// run.log when it is attached.
#pragma once

#include <spdlog/common.h>

#include <optional>
#include <string>

namespace keel {

// "trace", "debug", "info", "warn", "error", "off"; nullopt for anything else.
std::optional<spdlog::level::level_enum> parse_log_level(const std::string& name);

// The valid level names, for messages: "trace, debug, info, warn, error, off".
const char* log_level_names();

// Sets up the default logger: a console sink on stdout at `console_level` (pattern
// "[%T] message"; on a terminal each line first clears the line with "\r\033[K", so it
// replaces the console hook's progress bar instead of mixing with it) and the run-log sink.
// Calling it again changes the console level and keeps any attached run log.
void init_logging(spdlog::level::level_enum console_level);

// One process of several (data parallelism): console lines carry "[rank N] ". (Rank 0 alone
// writes run.log: the trainer attaches it there only.) On rank N > 0 the console shows only
// warnings and errors until log_setup_done, unless the console is at debug level: every
// rank's setup lines (components, shards, resume) repeat rank 0's.
void set_log_rank(int rank);

// The run's setup is over (the trainer calls it as training or the evaluation starts): the
// console of a rank N > 0 shows info lines again (its records with every_rank, its done line).
void log_setup_done();

// Starts writing run.log at `path` (created when missing, else appended to; not through a
// symlink): every message at debug level or above (trace too when the console is at trace),
// starting with those logged since init_logging or the last detach_run_log. Replaces a run log
// already attached. Calls init_logging(info) first when nothing set up logging (tests,
// embedding programs). Throws keel::Error naming the path when the file cannot be opened.
void attach_run_log(const std::string& path);
// The same with a descriptor open for writing (the trainer opens run.log relative to its run
// directory's descriptor, O_APPEND), taken over (closed on detach or on failure); `path` is
// what messages show.
void attach_run_log(int fd, const std::string& path);

// Flushes and closes the run log (nothing happens when none is attached). Call it before
// removing a run directory: later messages are kept in memory again.
void detach_run_log();

// Logging as init_logging(info) first made it, when anything set it up: the console at info
// without a rank tag, no run log attached and no message kept for one (keel::cli_main, between
// commands run in one process).
void reset_logging();

// The path of the attached run log, "" when none is attached.
std::string run_log_path();

// Writes one message to the run log only, not to the console (main records there the error a
// run ended with, which it prints itself on stderr). Kept in memory when none is attached.
void run_log_only(spdlog::level::level_enum level, const std::string& message);

}  // namespace keel
