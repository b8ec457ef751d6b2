// The commit protocol of a checkpoint that several processes (data-parallel ranks) write
// together, over the store's single-process protocol (store.hpp):
//
//   rank 0                                   rank r > 0
//   create the staging directory, share it   receive the staging directory
//   write its objects                        write its objects ("rank<r>.<stem>") into it
//   collect every rank's index               send its index (commit record format)
//   agree that every part was written  <-->  agree that every part was written
//   checksum everything, write commit.json,
//   commit (rename), share the directory     receive the committed directory
//
// A failure on any rank fails the save (and the run) on every rank, at the next step of the
// protocol, instead of leaving the others waiting until the timeout; nothing is committed
// unless every part was written.
#pragma once

#include <string>

#include "checkpoint/store.hpp"

namespace keel {

class ProcessGroup;

// Saves `snapshot` (this rank's objects) with every other rank of `group`; returns the
// committed directory on every rank. Throws keel::Error on every rank when any rank fails.
std::string save_on_every_rank(CheckpointStore& store, ProcessGroup& group, int rank,
                               const Snapshot& snapshot);

}  // namespace keel
