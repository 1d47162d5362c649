# Writes a C++ source defining `std::string_view FUNCTION()` that returns the text of INPUT,
# so a data file (the recipe schema) is part of the binary. Run as a script:
#   cmake -DINPUT=... -DOUTPUT=... -DFUNCTION=loom::recipe_schema_text -P embed_text.cmake
file(READ "${INPUT}" text)
string(FIND "${text}" ")loom_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw-string delimiter )loom_embed\"")
endif()
string(REGEX REPLACE "::[^:]*$" "" namespace "${FUNCTION}")
string(REGEX REPLACE "^.*::" "" name "${FUNCTION}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake; do not edit.\n"
  "#include <string_view>\n\nnamespace ${namespace} {\n\n"
  "std::string_view ${name}() {\n  static constexpr std::string_view text = R\"loom_embed(${text})loom_embed\";\n"
  "  return text;\n}\n\n}  // namespace ${namespace}\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
