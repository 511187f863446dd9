# GPT dataset indices, blending and index caches, checked against an independent NumPy oracle
# (megatron_indices.py, run by the tests themselves with the interpreter below).
megatron_test(test_gpt_dataset SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt_dataset.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/test_gpt_dataset_builder.cpp LIBS megatron_data)
target_include_directories(test_gpt_dataset PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(test_gpt_dataset PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_INDICES_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/megatron_indices.py")

# --dataloader-type cyclic against Megatron's random sampler restated over PyTorch's randperm.
megatron_test(test_random_sampler SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_random_sampler.cpp
  LIBS megatron_data)
target_compile_definitions(test_random_sampler PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_SAMPLER_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/random_sampler_oracle.py")

# --sft samples against Megatron's SFT tokenizer and dataset restated in Python.
megatron_test(test_sft_dataset SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_sft_dataset.cpp
  LIBS megatron_data)
target_compile_definitions(test_sft_dataset PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_SFT_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/sft_oracle.py")

# --fim-data samples against Megatron's GPTFIMDataset restated in Python with NumPy's RandomState.
megatron_test(test_fim_dataset SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_fim_dataset.cpp
  LIBS megatron_data)
target_compile_definitions(test_fim_dataset PRIVATE
  MEGATRON_PYTHON_ORACLE="${PYTHON_ORACLE}"
  MEGATRON_FIM_ORACLE="${CMAKE_CURRENT_SOURCE_DIR}/fim_oracle.py")
