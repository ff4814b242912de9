# Writes a C++ source defining `std::string_view <FUNCTION>()` that returns
# the bytes of INPUT, so a document (docs/errors.md) is compiled in as-is and
# the program never carries a second copy that could drift.
#   cmake -DINPUT=in.md -DOUTPUT=out.cc -DNAMESPACE=ns -DFUNCTION=Name -P embed_text.cmake
file(READ "${INPUT}" text)
set(delim "kvb_text")  # C++ allows at most 16 characters
string(FIND "${text}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )${delim}\"")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n"
  "#include <string_view>\n\n"
  "namespace ${NAMESPACE} {\n\n"
  "std::string_view ${FUNCTION}() {\n"
  "  static constexpr char kText[] = R\"${delim}(${text})${delim}\";\n"
  "  return std::string_view(kText, sizeof(kText) - 1);\n"
  "}\n\n"
  "}  // namespace ${NAMESPACE}\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
