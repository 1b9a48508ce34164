// --plot of `serval bench serve`: TTFT and ITL histograms and output throughput over time,
// drawn by gnuplot into one PNG.
#pragma once
#include <string>
#include <vector>

#include "clients/bench_metrics.h"

namespace serval::clients {

// Whether a `gnuplot` executable is on the PATH.
bool gnuplot_available();

// Throws serval::Error when gnuplot is not installed or fails.
void write_plot(const std::vector<RequestOutcome>& outcomes, double bench_start_s,
                const std::string& png_path);

}  // namespace serval::clients
