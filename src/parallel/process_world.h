// The processes of one job started by an MPI launcher (`mpirun -np N tandem ...`): one rank per process,
// which runs one device of the mesh. src/parallel/README.md ("Ranks in separate processes") has the design.
//
// Every process runs the same command on the same inputs (SPMD): each loads only its shard, the collectives
// keep the processes in step, the logits are gathered on every process, so every process samples the same
// tokens; only rank 0 prints. MPI carries the small collectives of CPU ranks and bootstraps NCCL for GPU
// ranks.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "parallel/comm.h"

namespace tandem {

struct ProcessWorld {
  int rank = 0;  // this process's rank in the job
  int size = 1;  // processes in the job; 1 when not started by a launcher
};

// The rank and size the launcher put in the environment (Open MPI's OMPI_COMM_WORLD_*, MPICH / Hydra's
// PMI_*), without starting MPI; {0, 1} when not started by a launcher.
ProcessWorld launcher_world();

// The job this process belongs to. When the launcher started several processes, the first call initialises
// MPI (MPI_THREAD_MULTIPLE) and registers its finalisation at exit; it throws Error when this tandem was
// built without MPI. A single process never touches MPI.
const ProcessWorld& process_world();

// Ends every process of the job after an error in this one (MPI_Abort), so that the others do not wait in a
// collective forever. Does nothing for a single process or when MPI was never started.
void abort_process_world(int exit_code);

// A comm whose only local rank is this process's: rank process_world().rank of process_world().size, on
// `device`. CPU devices: collectives over MPI (all-reduce as an all-gather plus a rank-order sum, so every
// process gets the same bits). CUDA devices: NCCL, bootstrapped by broadcasting its unique id over MPI.
std::unique_ptr<Comm> create_process_comm(Device& device);

}  // namespace tandem
