// The subcommands of the `megatron` binary. Each parses its own flags and returns the process exit
// code; errors propagate as exceptions to main(), which maps them to exit codes.
#pragma once

namespace megatron::cli {

int train_command(int argc, char** argv);
int score_command(int argc, char** argv);
int generate_command(int argc, char** argv);
int serve_command(int argc, char** argv);
int evaluate_command(int argc, char** argv);
int convert_command(int argc, char** argv);
int bench_command(int argc, char** argv);
int plan_command(int argc, char** argv);
int preprocess_command(int argc, char** argv);
int merge_datasets_command(int argc, char** argv);
int build_sequences_command(int argc, char** argv);
int flags_command(int argc, char** argv);
int scenes_command(int argc, char** argv);

}  // namespace megatron::cli
