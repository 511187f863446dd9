# Tokenizer tests. test_tokenizer: unit tests on files the tests write themselves (no network, no
# npm). tokenizer_parity: the C++ tokenizers against independent encoders (js-tiktoken,
# gpt-3-encoder, @huggingface/tokenizers, spm_encode) on the Brown corpus and edge cases; it
# installs its pinned npm packages into the build tree and drives test_tokenizer's disabled
# TokenizerParity case to produce the C++ side.
megatron_test(test_tokenizer SOURCES test_tokenizer.cpp LIBS megatron_data)

add_test(NAME tokenizer_parity
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_parity.sh ${PROJECT_SOURCE_DIR}
          ${PROJECT_BINARY_DIR}/npm $<TARGET_FILE:test_tokenizer>
          ${PROJECT_BINARY_DIR}/tokenizer_parity)
# Installing the npm packages on a cold cache, the JS encoders over ~30k documents and
# spm_train take a few minutes on a 2-core machine.
set_tests_properties(tokenizer_parity PROPERTIES TIMEOUT 1200 LABELS "oracle;slow")
