# T5 dataset samples against an independent NumPy restatement of Megatron's
# T5MaskedWordPieceDataset (t5_samples.py, run by the test with the interpreter below; it imports
# bert_samples.py for the indexed-dataset reader, the vocabulary and helpers.cpp's build_mapping).
megatron_test(test_t5_dataset SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_t5_dataset.cpp
  LIBS megatron_data)
target_compile_definitions(test_t5_dataset PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_T5_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/t5_samples.py")
