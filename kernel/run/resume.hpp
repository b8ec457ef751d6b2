// Where a run starts from: `keel train --resume` (the checkpoint chosen, checked against this
// run, and loaded whole) and [checkpoint] init_from (model weights and hook state only).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "checkpoint/commit.hpp"
#include "checkpoint/store.hpp"

namespace keel {

struct Run;

// `--resume [PATH]`: rank 0 chooses the checkpoint (PATH, or the newest complete one of the
// run directory), verifies it and shares it; every rank reads its metadata and checks that
// this run can continue it (run.resume). Runs before any component is created. Nothing when
// there is no checkpoint yet (a fresh run).
void choose_resume_point(Run& run);

// Loads everything the resume checkpoint holds into the components, and the progress, records
// and loss scale it saved.
void load_resume_point(Run& run);

// Positions the training data at micro-batch `batch` of `epoch` (a resumed run): the dataset's
// seek, or replaying batches without one.
void seek_train_data(Run& run, int64_t epoch, int64_t batch);

// [checkpoint] init_from: model weights (selected by init_include / init_exclude, names
// rewritten by init_rename) and hook state; nothing else.
void load_init_from(Run& run);

// Shared by both (and [models.NAME], run/own_step.cpp): a model's tensors against a checkpoint's
// index (every one present with its shape; `model` labels it in messages), and hook state by
// label.
void check_model_tensors(const std::string& model, const CommitRecord& rec,
                         const std::string& dir, const TensorList& into, const std::string& hint);
// The hooks' state a checkpoint's commit record lists (its `hooks` object), by name; whether a
// listed tensor has `t`'s dtype and shape; and each one's "<dtype> <shape>" ("F32 [3, 4]").
std::map<std::string, const CommitRecord::Tensor*> stored_hook_state(const CommitRecord& rec);
bool same_layout(const CommitRecord::Tensor& stored, const at::Tensor& t);
std::string layout(const CommitRecord::Tensor& stored);
std::string layout(const at::Tensor& t);

// `fresh_on_mismatch` (init_from): a hook whose stored state differs in dtype or shape from its
// own (a hook that keeps a copy of a model of another shape) starts afresh, with a warning;
// otherwise the load fails naming the tensor.
void load_hook_state(Run& run, const CommitRecord& rec, const std::string& dir,
                     bool fresh_on_mismatch);

// The file `name` of the checkpoint `dir` that a run resumes (trainer_state.toml,
// manifest.resolved.toml); a read that fails is an error line with a hint.
std::string read_resume_file(const std::string& dir, const std::string& name);

}  // namespace keel
