// OpenMP thread count: defaults to the cores available to this process (its CPU affinity mask),
// not the machine's core count, so a rank confined by a launcher never oversubscribes.
#pragma once

namespace megatron {

int available_cores();
// Sets the OpenMP thread count; n <= 0 means available_cores().
void set_num_threads(int n);
int num_threads();

}  // namespace megatron
