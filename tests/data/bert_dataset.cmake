# BERT dataset samples against an independent NumPy restatement of Megatron's
# BERTMaskedWordPieceDataset (bert_samples.py, run by the test with the interpreter below).
megatron_test(test_bert_dataset SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_bert_dataset.cpp
  LIBS megatron_data)
target_compile_definitions(test_bert_dataset PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_BERT_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/bert_samples.py")
