#include "dcp/rank_outcomes.h"
#include "util/exception_message.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <exception>

namespace stowage::dcp {

DistributedCheckpointError::DistributedCheckpointError(std::string step, std::map<int64_t, RankFailure> failures)
    : Error([&] {
        std::string text = fmt::format("distributed checkpoint failed in step '{}':", step);
        for (const auto& [rank, failure] : failures) text += fmt::format(" [rank {}] {}", rank, failure.message);
        return text;
      }()),
      step_(std::move(step)),
      failures_(std::move(failures)) {}

namespace detail {
namespace {

using nlohmann::json;

// A kind travels as its enumerator's value: every rank runs the same build.
json encode_failure(const RankFailure& f) {
  return json{{"kind", static_cast<int>(f.kind)}, {"message", f.message}, {"path", f.path}, {"operation", f.operation},
              {"errno", f.error_number},          {"entry", f.entry},     {"file", f.file}, {"offset", f.offset}};
}

RankFailure decode_failure(const json& j) {
  RankFailure f;
  f.kind = static_cast<RankFailure::Kind>(j.at("kind").get<int>());
  f.message = j.at("message").get<std::string>();
  f.path = j.at("path").get<std::string>();
  f.operation = j.at("operation").get<std::string>();
  f.error_number = j.at("errno").get<int>();
  f.entry = j.at("entry").get<std::string>();
  f.file = j.at("file").get<std::string>();
  f.offset = j.at("offset").get<int64_t>();
  return f;
}

}  // namespace

RankFailure failure_in_flight(const std::string& prefix) {
  RankFailure f;
  try {
    throw;
  } catch (const Error& e) {
    f.kind = e.kind();
    f.message = e.what();
    if (const auto* io = dynamic_cast<const IoError*>(&e)) {
      f.path = io->path();
      f.operation = io->operation();
      f.error_number = io->error_number();
    } else if (const auto* corruption = dynamic_cast<const CorruptionError*>(&e)) {
      f.entry = corruption->entry();
      f.file = corruption->file();
      f.offset = corruption->offset();
    }
  } catch (const std::exception& e) {
    f.message = exception_message(e);
  } catch (...) {
    f.message = "unknown exception";
  }
  f.message = prefix + f.message;
  return f;
}

RankFailure plain_failure(const std::string& message) {
  RankFailure f;
  f.message = message;
  return f;
}

namespace {

json encode_outcome(const RankOutcome& outcome) {
  if (outcome.failure) return json{{"ok", false}, {"failure", encode_failure(*outcome.failure)}};
  return json{{"ok", true}, {"v", outcome.payload}};
}

RankOutcome decode_outcome(const std::string& bytes) {
  const json outcome = json::parse(bytes);
  if (outcome.at("ok").get<bool>()) return {outcome.at("v").get<std::string>(), std::nullopt};
  return {"", decode_failure(outcome.at("failure"))};
}

std::string encode_verdict(const Verdict& verdict) {
  if (verdict.failures.empty()) return json{{"ok", true}, {"v", verdict.payload}}.dump();
  json list = json::array();
  for (const auto& [rank, failure] : verdict.failures) list.push_back(json{rank, encode_failure(failure)});
  return json{{"ok", false}, {"failures", std::move(list)}}.dump();
}

Verdict decode_verdict(const std::string& bytes) {
  const json parsed = json::parse(bytes);
  Verdict verdict;
  if (parsed.at("ok").get<bool>()) {
    verdict.payload = parsed.at("v").get<std::string>();
    return verdict;
  }
  for (const json& failure : parsed.at("failures")) {
    verdict.failures[failure.at(0).get<int64_t>()] = decode_failure(failure.at(1));
  }
  return verdict;
}

std::vector<RankOutcome> decode_outcomes(const std::vector<std::string>& gathered) {
  std::vector<RankOutcome> outcomes;
  outcomes.reserve(gathered.size());
  for (const std::string& bytes : gathered) outcomes.push_back(decode_outcome(bytes));
  return outcomes;
}

}  // namespace

std::map<int64_t, RankFailure> failures_of(const std::vector<RankOutcome>& outcomes,
                                           std::vector<std::string>* payloads) {
  std::map<int64_t, RankFailure> failures;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].failure) {
      failures[static_cast<int64_t>(r)] = *outcomes[r].failure;
    } else if (payloads != nullptr) {
      payloads->push_back(outcomes[r].payload);
    }
  }
  return failures;
}

const std::string& accept(const Verdict& verdict, const char* step) {
  if (verdict.failures.empty()) return verdict.payload;
  throw DistributedCheckpointError(step, verdict.failures);
}

std::vector<RankOutcome> gather_outcomes(const dist::ProcessGroup& group, const RankOutcome& mine, int64_t root) {
  return decode_outcomes(group.gather(encode_outcome(mine).dump(), root));
}

std::vector<RankOutcome> all_gather_outcomes(const dist::ProcessGroup& group, const RankOutcome& mine) {
  return decode_outcomes(group.all_gather(encode_outcome(mine).dump()));
}

Verdict scatter_verdicts(const dist::ProcessGroup& group, const std::vector<Verdict>& verdicts, int64_t root) {
  std::vector<std::string> parts;
  parts.reserve(verdicts.size());
  for (const Verdict& verdict : verdicts) parts.push_back(encode_verdict(verdict));
  return decode_verdict(group.scatter(parts, root));
}

Verdict broadcast_verdict(const dist::ProcessGroup& group, const Verdict& verdict, int64_t root) {
  return decode_verdict(group.broadcast(group.rank() == root ? encode_verdict(verdict) : std::string(), root));
}

void rethrow_as_checkpoint_error(const char* step, int64_t rank) {
  try {
    throw;
  } catch (const dist::CollectiveError& e) {
    std::map<int64_t, RankFailure> failures;
    for (const int64_t missing : e.unresponsive_ranks()) {
      RankFailure failure = plain_failure(fmt::format("dead or unresponsive: {}", e.what()));
      failure.kind = RankFailure::Kind::kUnresponsive;
      failures[missing] = failure;
    }
    if (failures.empty()) failures[rank] = plain_failure(e.what());
    throw DistributedCheckpointError(step, std::move(failures));
  }
}

}  // namespace detail
}  // namespace stowage::dcp
