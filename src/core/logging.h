// Console output: timestamps in Megatron's format and line-at-a-time flushing.
//
// Under mpirun stdout is a pipe; every line is flushed so logs arrive in order and survive a
// crash. This is not a logging framework: one function per kind of line.
#pragma once

#include <string>

namespace megatron {

// "YYYY-MM-DD HH:MM:SS" in local time, as Megatron's iteration line prints it.
std::string timestamp();

// Prints one line to stdout (a newline is added) and flushes.
void log_line(const std::string& line);

// Prints one line to stderr prefixed with "error: " and flushes.
void log_error(const std::string& line);

// printf-style formatting into a std::string.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// A double as Python's repr prints it in the common cases (0.1, 1e-05, 10000.0): the shortest
// %g that reads back the same value, with ".0" on integers (Megatron's printed values).
std::string python_float(double v);

}  // namespace megatron
