// Copies of a library's bytes that nobody can change: what is checked and hashed is what
// dlopen maps (registry.hpp, dependencies.hpp).
#pragma once

#include <string>

namespace keel {

// A copy of the regular file open at `fd` in a memfd (MFD_ALLOW_SEALING | MFD_CLOEXEC), sealed
// against writing, growing, shrinking and further seals, so that what is checked and hashed in
// it is what dlopen of /proc/self/fd/N maps. Returns the memfd, or -1 with `*error` set.
// Writing the copy counts against the file size limit (RLIMIT_FSIZE, `ulimit -f`): when the
// file is larger than the soft limit, the limit is raised for the copy (to the hard limit, or,
// where that is not enough, to unlimited if the process may: CAP_SYS_RESOURCE) and put back
// right after. The limit is the process's: a thread writing elsewhere during the copy is not
// held to it meanwhile. Where it cannot be raised far enough: with `path_checked` (the file
// passed unsafe_path, so only this user or root can change it) the result is a duplicate of
// `fd` itself, the file read twice (to check and hash, then by dlopen) as before sealed copies,
// and a debug line in the run log says so; without it, -1 and an error that names the limit.
int sealed_copy(int fd, const std::string& name, bool path_checked, std::string* error);

}  // namespace keel
