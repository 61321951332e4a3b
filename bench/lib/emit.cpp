#include "emit.h"

#include <stowage/error.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>

namespace stowage::bench {
namespace {

std::string formatted(const std::string& format, const nlohmann::json& value) {
  const auto with = [&format](const auto& v) { return fmt::format(fmt::runtime(format), v); };
  if (value.is_number_float()) return with(value.get<double>());
  if (value.is_number_unsigned()) return with(value.get<uint64_t>());
  if (value.is_number_integer()) return with(value.get<int64_t>());
  if (value.is_boolean()) return met_text(value.get<bool>());
  if (value.is_string()) return with(value.get<std::string>());
  return value.dump();
}

}  // namespace

Row& Row::field(const std::string& key, const nlohmann::json& value, const std::string& format,
                const std::string& heading) {
  object_[key] = value;
  cells_.push_back(
      {heading.empty() ? key : heading, formatted(format, value), value.is_string() || value.is_boolean()});
  return *this;
}

Row& Row::json(const std::string& key, nlohmann::json value) {
  object_[key] = std::move(value);
  return *this;
}

Row& Row::text(const std::string& heading, std::string cell) {
  const bool word = !cell.empty() && std::isalpha(static_cast<unsigned char>(cell.front())) != 0;
  cells_.push_back({heading, std::move(cell), word});
  return *this;
}

Row& Row::missing(const std::string& heading) {
  cells_.push_back({heading, "-", false});
  return *this;
}

nlohmann::json Table::json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& row : rows_) rows.push_back(row.object_);
  return rows;
}

std::string Table::text(const std::string& indent) const {
  if (rows_.empty()) return "";
  const std::vector<Row::Cell>& columns = rows_.front().cells_;
  std::vector<size_t> widths;
  widths.reserve(columns.size());
  for (const Row::Cell& column : columns) widths.push_back(column.heading.size());
  for (const Row& row : rows_) {
    if (row.cells_.size() != columns.size()) throw Error("bench: a table's rows have different columns");
    for (size_t c = 0; c < columns.size(); ++c) widths[c] = std::max(widths[c], row.cells_[c].text.size());
  }
  const auto line = [&](const auto& cell_text) {
    std::string out = indent;
    for (size_t c = 0; c < columns.size(); ++c) {
      if (c > 0) out += "  ";
      out += fmt::format(fmt::runtime(columns[c].left ? "{:<{}}" : "{:>{}}"), cell_text(c), widths[c]);
    }
    while (out.size() > indent.size() && out.back() == ' ') out.pop_back();  // a left-aligned last column's padding
    return out + "\n";
  };
  std::string out = line([&](size_t c) { return columns[c].heading; });
  for (const Row& row : rows_) out += line([&](size_t c) { return row.cells_[c].text; });
  return out;
}

void print_result(const nlohmann::json& figures, const std::string& text, bool as_json) {
  const std::string out = as_json ? figures.dump() + "\n" : text;
  std::fputs(out.c_str(), stdout);
  if (!out.empty() && out.back() != '\n') std::fputc('\n', stdout);
}

}  // namespace stowage::bench
