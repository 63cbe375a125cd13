# Documentation checks (label docs): docs/config.md's key table against
# the keys gma_config_parse accepts (tests/docs/test_config_keys.c), and the
# planted variants that show the check fails when they disagree.
gma_test(NAME docs_config_keys SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config_keys.c INTERNAL
  LABELS docs ARGS ${PROJECT_SOURCE_DIR}/docs/config.md)
gma_test(NAME docs_config_keys_planted EXE docs_config_keys LABELS docs
  ARGS --planted ${PROJECT_SOURCE_DIR}/docs/config.md)
