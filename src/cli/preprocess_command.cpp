// Being written: megatron preprocess.
