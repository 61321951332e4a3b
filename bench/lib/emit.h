#pragma once

// How every benchmark reports: its figures as one JSON object of named fields, printed as
// they are (--json) or as text; and its rows (one per configuration, mode or target) as a
// Table, each row's fields named once and written both into the row's JSON object and
// into a column of the aligned text table.

#include <nlohmann/json.hpp>

#include <string>
#include <utility>
#include <vector>

namespace stowage::bench {

// "met" or "NOT met".
inline const char* met_text(bool met) {
  return met ? "met" : "NOT met";
}

// One row of a Table: fields of its JSON object, cells of its text line, or both.
class Row {
 public:
  // `key` in the JSON, and a cell under `heading` (`key` when empty) as the fmt format
  // `format` formats the value ("{:.3f}").
  Row& field(const std::string& key, const nlohmann::json& value, const std::string& format = "{}",
             const std::string& heading = "");
  // `key` in the JSON only.
  Row& json(const std::string& key, nlohmann::json value);
  // A cell of the text only, a figure derived for the reader (a ratio, a unit, a verdict).
  Row& text(const std::string& heading, std::string cell);
  // A figure this row lacks (a peer's that was not measured): "-" under `heading`, aligned
  // as the column's numbers are, and nothing in the JSON.
  Row& missing(const std::string& heading);

 private:
  friend class Table;
  struct Cell {
    std::string heading;
    std::string text;
    bool left;  // words (names, verdicts) align left, numbers right
  };
  nlohmann::json object_ = nlohmann::json::object();
  std::vector<Cell> cells_;
};

class Table {
 public:
  void add(Row row) { rows_.push_back(std::move(row)); }

  // The rows' JSON objects, in the order added.
  nlohmann::json json() const;

  // The first row's headings, then a line a row, `indent` before each; every column as
  // wide as its widest cell, two spaces apart. Every row has the same cells.
  std::string text(const std::string& indent = "") const;

 private:
  std::vector<Row> rows_;
};

// What a benchmark prints: with `as_json` its figures as JSON on one line (one object, or
// an array of them), else `text`; either ends with a newline.
void print_result(const nlohmann::json& figures, const std::string& text, bool as_json);

}  // namespace stowage::bench
