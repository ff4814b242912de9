#include "tools/explain.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>

#include "common/error_catalog.h"
#include "kvbridge/errors.h"

namespace kvbridge::tools {
namespace {

// "Peer-Exited" and "PEER_EXITED" mean peer_exited.
std::string Normalize(std::string name) {
  for (char& c : name) {
    c = c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return name;
}

int List() {
  const auto& catalog = internal::ErrorCatalog();
  size_t width = 0;
  for (const auto& e : catalog) width = std::max(width, e.name.size());
  for (const auto& e : catalog) {
    std::fputs(fmt::format("{:<{}}  {}\n", e.name, width, e.summary).c_str(), stdout);
  }
  std::fputs(
      "\nkvbridge explain CAUSE prints what a cause means, when it happens and what to do.\n",
      stdout);
  return 0;
}

int Explain(const std::string& given) {
  const internal::CatalogEntry* entry = internal::FindCatalogEntry(Normalize(given));
  if (entry == nullptr) {
    std::string names;
    for (FailureCause c : AllFailureCauses()) {
      if (!names.empty()) names += ", ";
      names += FailureCauseName(c);
    }
    std::fputs(fmt::format("kvbridge explain: unknown cause '{}'; valid causes: {}\n", given, names)
                   .c_str(),
               stderr);
    return 2;
  }
  std::fputs(entry->text.c_str(), stdout);
  return 0;
}

}  // namespace

void AddExplainCommand(CLI::App& app, std::function<int()>& run) {
  CLI::App* cmd = app.add_subcommand(
      "explain", "What a failure cause means and what to do (the error catalog, docs/errors.md)");
  auto cause = std::make_shared<std::string>();
  cmd->add_option("cause", *cause, "A cause name, e.g. peer_exited; omit to list them all");
  cmd->callback(
      [&run, cause] { run = [cause] { return cause->empty() ? List() : Explain(*cause); }; });
}

}  // namespace kvbridge::tools
