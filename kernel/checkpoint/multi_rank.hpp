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
//
// An asynchronous save of several ranks (save_async_on_every_rank) follows the same steps on
// each rank's writer thread, through the store only (distributed/store_client.hpp: a client
// of its own), never through a collective, so the training thread keeps the process group to
// itself and its collectives' order never depends on a writer:
//
//   rank 0's writer                          rank r's writer
//   create the staging directory, set
//   "<save>/staging" to it                   get "<save>/staging"
//   write its objects                        write its part, set "<save>/part<r>" to its index
//   get every "<save>/part<r>"                 (or to "failed:<why>")
//   checksum everything, write commit.json,
//   commit (rename), set "<save>/committed"  get "<save>/committed": the directory,
//   to the directory (or "failed:<why>")       or the failure
//
// Every get waits at most [distributed] timeout_s. A rank that fails still sets its keys (to
// "" or "failed:<why>"), so the others fail at once rather than at the timeout; a rank that
// dies leaves the others failing at the timeout, and nothing is committed unless every part
// was written.
#pragma once

#include <memory>
#include <string>

#include "checkpoint/store.hpp"

namespace keel {

class ProcessGroup;
class StoreClient;

// Saves `snapshot` (this rank's objects) with every other rank of `group`; returns the
// committed directory on every rank. Throws keel::Error on every rank when any rank fails.
std::string save_on_every_rank(CheckpointStore& store, ProcessGroup& group, int rank,
                               const Snapshot& snapshot);

// Starts an asynchronous save of `snapshot` (this rank's objects) with every other rank
// (store.save_async): its writer thread follows the protocol above through `client`, and
// store.wait() returns the committed directory on every rank, or throws on every rank when
// any rank failed. Every rank starts its saves in the same order; `serial` (the same on every
// rank, new for each save) keeps the saves' keys apart.
void save_async_on_every_rank(CheckpointStore& store, std::shared_ptr<StoreClient> client,
                              int rank, int world, int64_t serial, Snapshot snapshot);

}  // namespace keel
