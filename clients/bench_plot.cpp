#include "clients/bench_plot.h"

#include <fmt/format.h>

#include <unistd.h>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "base/error.h"

namespace serval::clients {
namespace fs = std::filesystem;

bool gnuplot_available() {
  return std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

void write_plot(const std::vector<RequestOutcome>& outcomes, double bench_start_s,
                const std::string& png_path) {
  if (!gnuplot_available())
    throw Error(
        "--plot needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)");
  fs::path dir = fs::temp_directory_path() / fmt::format("serval-plot-{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream ttft(dir / "ttft.dat"), itl(dir / "itl.dat"), tput(dir / "tput.dat");
  std::map<long long, long long> bins;  // second -> tokens
  double max_ttft = 0, max_itl = 0;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) continue;
    ttft << o.ttft_s * 1000 << "\n";
    max_ttft = std::max(max_ttft, o.ttft_s * 1000);
    double t = o.start_s + o.ttft_s;
    ++bins[static_cast<long long>(std::floor(t - bench_start_s))];
    for (double gap : o.itl_s) {
      itl << gap * 1000 << "\n";
      max_itl = std::max(max_itl, gap * 1000);
      t += gap;
      ++bins[static_cast<long long>(std::floor(t - bench_start_s))];
    }
  }
  for (const auto& [s, n] : bins) tput << s << " " << n << "\n";
  ttft.close(), itl.close(), tput.close();
  std::ofstream script(dir / "plot.gp");
  // Histograms with 40 bins over [0, max].
  script << fmt::format(
      "set terminal png size 1200,1200\n"
      "set output '{}'\n"
      "set multiplot layout 3,1\n"
      "bin(x,w)=w*floor(x/w)+w/2.0\n"
      "set style fill solid 0.6\n"
      "set yrange [0:*]\n"
      "set title 'TTFT (ms)'\nset ylabel 'requests'\n"
      "w={}\nset boxwidth w*0.9\n"
      "plot '{}' using (bin($1,w)):(1.0) smooth freq with boxes notitle\n"
      "set title 'ITL (ms)'\nset ylabel 'gaps'\n"
      "w={}\nset boxwidth w*0.9\n"
      "plot '{}' using (bin($1,w)):(1.0) smooth freq with boxes notitle\n"
      "set title 'Output throughput (tok/s, 1-second bins)'\nset xlabel 's'\n"
      "set ylabel 'tok/s'\nset boxwidth 0.9\nset xrange [0:*]\n"
      "plot '{}' using ($1+0.5):2 with boxes notitle\n"
      "unset multiplot\n",
      png_path, std::max(max_ttft / 40, 1e-3), (dir / "ttft.dat").string(),
      std::max(max_itl / 40, 1e-3), (dir / "itl.dat").string(), (dir / "tput.dat").string());
  script.close();
  int rc = std::system(fmt::format("gnuplot '{}'", (dir / "plot.gp").string()).c_str());
  fs::remove_all(dir);
  if (rc != 0) throw Error(fmt::format("gnuplot failed (status {}) writing {}", rc, png_path));
}

}  // namespace serval::clients
