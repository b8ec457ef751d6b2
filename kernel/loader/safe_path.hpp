// Whether a file or directory can be trusted from where it lies: the path rule.
//
// Another user must not be able to change what a path names. So, walking the path from /
// component by component, and through every symbolic link on it (the link's own directory, then
// the directories of its target):
//   - every directory, file and link met belongs to this user or to root;
//   - no directory met is writable by its group or by others, with one exception: a sticky
//     directory (mode +t, like /tmp's 1777) may be passed through, because in a sticky
//     directory only an entry's owner (or the directory's, or root) can rename or delete the
//     entry, and the entry below it must belong to this user or root (the rule above);
//   - the directory that holds the file (or the link, or that is the directory checked) is
//     never writable by others, sticky or not: another user could add names to it;
//   - the file is not writable by its group or by others.
// So /tmp/keel-xyz (0700, ours) is a safe place for plugins; /tmp itself, a 0777 directory on
// the way, or a directory of another user is not. registry.hpp says how discovery uses it;
// package.cpp checks a package's files at install with it too.
#pragma once

#include <sys/stat.h>

#include <string>

namespace keel {

// "" when `path` satisfies the rule above, else why not, as a phrase that names the component
// ("its directory /srv/p is writable by every user (mode 0777)"). `is_dir`: `path` names a
// directory (a RUNPATH entry), else a file. On success, `*final` (when given) is the lstat of
// the file or directory the path ends at, for comparing with an open descriptor's inode.
std::string unsafe_path(const std::string& path, bool is_dir, struct stat* final = nullptr);

}  // namespace keel
