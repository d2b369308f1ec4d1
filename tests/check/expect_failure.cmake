# Runs one example with a planted bug and passes only if it exits 1 (a FAIL verdict, not a crash
# or a usage error) and its output matches EXPECT, e.g. the tensor and element the report names.
#   cmake -DPROGRAM=<exe> -DARGS="--ranks 4 --mutate position" -DEXPECT=<regex> -P expect_failure.cmake
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: expected exit 1 (FAIL), got '${rc}'\n${out}${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: output does not match '${EXPECT}'\n${out}${err}")
endif()
message(STATUS "exit 1 and output matches '${EXPECT}'")
