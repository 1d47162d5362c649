# The git commit a source tree is at, for `loom --version` (src/core/version.h).
#   loom_git_commit(SOURCE_DIR OUT_VAR)
# sets OUT_VAR to HEAD's commit (12 hex digits), or "unknown" where there is no git, or
# SOURCE_DIR is not the top of a work tree (a release tarball, even one unpacked inside
# another repository, which must not report that repository's commit).
#
# Run as a script, it prints the commit of SOURCE_DIR (tests/cli: the tarball case):
#   cmake -DSOURCE_DIR=... -P git_commit.cmake
function(loom_git_commit source_dir out_var)
  set(commit unknown)
  find_package(Git QUIET)
  if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --show-toplevel
                    WORKING_DIRECTORY ${source_dir} OUTPUT_VARIABLE top RESULT_VARIABLE top_failed
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(NOT top_failed)
      file(REAL_PATH "${top}" top)
      file(REAL_PATH "${source_dir}" source)
    endif()
    if(NOT top_failed AND top STREQUAL source)
      execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
                      WORKING_DIRECTORY ${source_dir} OUTPUT_VARIABLE head RESULT_VARIABLE head_failed
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(NOT head_failed)
        set(commit ${head})
      endif()
    endif()
  endif()
  set(${out_var} ${commit} PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  loom_git_commit("${SOURCE_DIR}" commit)
  message("${commit}")
endif()
