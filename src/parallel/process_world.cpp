// The MPI job this process belongs to (process_world.h). Without MPI in the build, a launcher-started job of
// several processes is an error; a single process is the normal case and never needs MPI.
#include "parallel/process_world.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"

#if defined(TANDEM_HAVE_MPI)
#include <mpi.h>
#endif

namespace tandem {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (end != nullptr && *end == '\0' && x >= 0 && x < (1 << 20)) ? int(x) : fallback;
}

#if defined(TANDEM_HAVE_MPI)
bool g_mpi_started = false;

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
#endif

}  // namespace

ProcessWorld launcher_world() {
  ProcessWorld w;
  w.size = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
  w.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0));
  if (w.size < 1 || w.rank >= w.size) w = ProcessWorld{};
  return w;
}

const ProcessWorld& process_world() {
  static ProcessWorld world;
  static std::once_flag once;
  std::call_once(once, [] {
    const ProcessWorld env = launcher_world();
    if (env.size <= 1) return;
#if defined(TANDEM_HAVE_MPI)
    int provided = 0;
    int argc = 0;
    char** argv = nullptr;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS,
          "MPI_Init_thread failed");
    g_mpi_started = true;
    std::atexit(finalize_mpi);
    // The tensor split calls MPI from the thread that runs the forward, one call at a time, which needs at
    // least MPI_THREAD_SERIALIZED.
    check(provided >= MPI_THREAD_SERIALIZED,
          "this MPI library offers thread level " + std::to_string(provided) + ", tandem needs at least " +
              std::to_string(MPI_THREAD_SERIALIZED) + " (MPI_THREAD_SERIALIZED)");
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
#else
    throw Error("started by an MPI launcher as rank " + std::to_string(env.rank) + " of " +
                std::to_string(env.size) +
                " processes, but this tandem was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  });
  return world;
}

void abort_process_world(int exit_code) {
#if defined(TANDEM_HAVE_MPI)
  if (!g_mpi_started) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
#else
  (void)exit_code;
#endif
}

#if !defined(TANDEM_HAVE_MPI)
std::unique_ptr<Comm> create_process_comm(Device&) {
  throw Error("ranks in separate processes need MPI, and this tandem was built without it");
}
#endif

}  // namespace tandem
