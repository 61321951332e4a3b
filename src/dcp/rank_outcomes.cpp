#include "dcp/rank_outcomes.h"
#include "exception_message.h"

#include <stowage/error.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <exception>

namespace stowage::dcp {

CheckpointError::CheckpointError(std::string step, std::map<int64_t, RankFailure> failures)
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

const char* kind_name(RankFailure::Kind kind) {
  switch (kind) {
    case RankFailure::Kind::kInvalidArgument:
      return "invalid_argument";
    case RankFailure::Kind::kIo:
      return "io";
    case RankFailure::Kind::kCorruption:
      return "corruption";
    case RankFailure::Kind::kUnresponsive:
      return "unresponsive";
    case RankFailure::Kind::kError:
      break;
  }
  return "error";
}

RankFailure::Kind kind_named(const std::string& name) {
  for (const RankFailure::Kind kind : {RankFailure::Kind::kInvalidArgument, RankFailure::Kind::kIo,
                                       RankFailure::Kind::kCorruption, RankFailure::Kind::kUnresponsive}) {
    if (name == kind_name(kind)) return kind;
  }
  return RankFailure::Kind::kError;
}

json encode_failure(const RankFailure& f) {
  return json{{"kind", kind_name(f.kind)}, {"message", f.message}, {"path", f.path}, {"operation", f.operation},
              {"errno", f.error_number},   {"entry", f.entry},     {"file", f.file}, {"offset", f.offset}};
}

RankFailure decode_failure(const json& j) {
  RankFailure f;
  f.kind = kind_named(j.at("kind").get<std::string>());
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
  } catch (const IoError& e) {
    f.kind = RankFailure::Kind::kIo;
    f.path = e.path();
    f.operation = e.operation();
    f.error_number = e.error_number();
    f.message = e.what();
  } catch (const CorruptionError& e) {
    f.kind = RankFailure::Kind::kCorruption;
    f.entry = e.entry();
    f.file = e.file();
    f.offset = e.offset();
    f.message = e.what();
  } catch (const InvalidArgument& e) {
    f.kind = RankFailure::Kind::kInvalidArgument;
    f.message = e.what();
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

std::string outcome_ok(const std::string& payload) {
  return json{{"ok", true}, {"v", payload}}.dump();
}

std::string outcome_failed(const RankFailure& failure) {
  return json{{"ok", false}, {"failure", encode_failure(failure)}}.dump();
}

bool succeeded(const std::string& outcome_or_verdict) {
  return json::parse(outcome_or_verdict).at("ok").get<bool>();
}

std::map<int64_t, RankFailure> failures_of(const std::vector<std::string>& outcomes,
                                           std::vector<std::string>* payloads) {
  std::map<int64_t, RankFailure> failures;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    const json outcome = json::parse(outcomes[r]);
    if (outcome.at("ok").get<bool>()) {
      if (payloads != nullptr) payloads->push_back(outcome.at("v").get<std::string>());
    } else {
      failures[static_cast<int64_t>(r)] = decode_failure(outcome.at("failure"));
    }
  }
  return failures;
}

std::string verdict_ok(const std::string& payload) {
  return json{{"ok", true}, {"v", payload}}.dump();
}

std::string verdict_failed(const std::map<int64_t, RankFailure>& failures) {
  json list = json::array();
  for (const auto& [rank, failure] : failures) list.push_back(json{rank, encode_failure(failure)});
  return json{{"ok", false}, {"failures", std::move(list)}}.dump();
}

std::string accept(const std::string& verdict, const char* step) {
  const json parsed = json::parse(verdict);
  if (parsed.at("ok").get<bool>()) return parsed.at("v").get<std::string>();
  std::map<int64_t, RankFailure> failures;
  for (const json& failure : parsed.at("failures")) {
    failures[failure.at(0).get<int64_t>()] = decode_failure(failure.at(1));
  }
  throw CheckpointError(step, std::move(failures));
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
    throw CheckpointError(step, std::move(failures));
  }
}

}  // namespace detail
}  // namespace stowage::dcp
