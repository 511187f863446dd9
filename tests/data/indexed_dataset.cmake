# Indexed dataset (.bin/.idx) and `megatron preprocess`. The independent NumPy implementation of
# the format (idx_independent.py) is run by the C++ test to cross-check our reader and builder,
# and on its own to test the preprocess command end to end.
megatron_test(test_indexed_dataset SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_indexed_dataset.cpp
  LIBS megatron_data)
target_compile_definitions(test_indexed_dataset PRIVATE
  MEGATRON_TEST_PYTHON="${PYTHON_ORACLE}"
  MEGATRON_IDX_INDEPENDENT_PY="${CMAKE_CURRENT_LIST_DIR}/idx_independent.py")

add_test(NAME preprocess_end_to_end
  COMMAND ${PYTHON_ORACLE} ${CMAKE_CURRENT_LIST_DIR}/idx_independent.py preprocess-tests
          --megatron $<TARGET_FILE:megatron>)
set_tests_properties(preprocess_end_to_end PROPERTIES TIMEOUT 600 LABELS "e2e;oracle")

# `megatron merge_datasets` against the same independent writer: byte-identical merges (text and
# multimodal), the refusals.
add_test(NAME merge_datasets
  COMMAND ${PYTHON_ORACLE} ${CMAKE_CURRENT_LIST_DIR}/merge_datasets_test.py
          --megatron $<TARGET_FILE:megatron>)
set_tests_properties(merge_datasets PROPERTIES TIMEOUT 300 LABELS "e2e;oracle")
