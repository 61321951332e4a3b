#pragma once

// Saves that must fail (a full disk, an I/O error), in every way the reliability tests
// save: synchronously, asynchronously staged by the writer, and asynchronously staged on
// a DefaultStager's thread; one file per rank or per tensor; one or three threads.

#include "reliability/generations.h"

#include <stowage/dcp/dcp.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace stowage::reliability {

struct SaveConfig {
  const char* stager;  // "sync", "writer", "background"
  bool single_file;
  int64_t threads;
};

inline const std::vector<SaveConfig> kSaveConfigs = {{"sync", true, 1},       {"sync", false, 3},
                                                     {"writer", true, 3},     {"writer", false, 1},
                                                     {"background", true, 1}, {"background", false, 3}};

// How a save failed: the message, and the system call's, for an IoError (else
// error_number 0).
struct FailedSave {
  std::string message;
  std::string path;
  std::string operation;
  int error_number = 0;
};

// Saves `training` into `dir` as `config` says and returns how it failed. While an
// async save's write fails in the background, the training thread carries on: it fills
// its tensors with `next_generation` and checks them. A save that succeeds is a test
// failure, reported with `why_it_must_fail`, and returns an empty FailedSave.
inline FailedSave failing_save(const std::string& dir, const SaveConfig& config, StateDict& training,
                               dcp::DefaultStager& background, int64_t next_generation,
                               const std::string& why_it_must_fail) {
  dcp::FileSystemWriter writer(
      dir, dcp::FileSystemWriterOptions().single_file_per_rank(config.single_file).thread_count(config.threads));
  try {
    if (std::string(config.stager) == "sync") {
      dcp::save(training, writer);
    } else {
      dcp::AsyncSaveResponse response =
          dcp::async_save(training, writer, std::string(config.stager) == "background" ? &background : nullptr);
      response.staging_completion.get();
      fill_generation(training, next_generation);
      EXPECT_EQ(compare_to_generation(training, next_generation), "");
      response.upload_completion.get();
    }
    ADD_FAILURE() << "the save succeeded " << why_it_must_fail;
  } catch (const IoError& e) {
    return FailedSave{e.what(), e.path(), e.operation(), e.error_number()};
  } catch (const Error& e) {
    return FailedSave{e.what()};
  }
  return {};
}

}  // namespace stowage::reliability
