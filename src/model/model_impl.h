// What a tandem::Model holds: the mapped GGUF file, the mesh of devices the weights live on, and one decoder
// per rank (one in all when the model is not split, or split by rows).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/decoder.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/rank_threads.h"
#include "parallel/row_split.h"
#include "tandem/model.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

// One rank: the device it runs on, the Ops it runs with (RowSplitOps for a row split) and its decoder.
struct ModelRank {
  Device* device = nullptr;
  Ops* ops = nullptr;
  DecoderModel* decoder = nullptr;
};

struct Model::Impl {
  std::shared_ptr<const Model> shared_from;  // weights this model borrows live there (ModelParams)
  std::unique_ptr<gguf::GgufFile> file;      // the weights point into its mapping
  MeshSpec mesh;
  std::vector<std::unique_ptr<Device>> devices;  // mesh order (one for none)
  std::unique_ptr<Comm> comm;                    // tensor split over 2+ ranks
  std::unique_ptr<RowSplitWeights> row_split;    // row split
  std::unique_ptr<RowSplitOps> row_ops;          // the model's own (sessions make theirs: session_impl.h)
  std::vector<std::unique_ptr<DecoderModel>> decoders;
  std::vector<ModelRank> ranks;   // layer / tensor: one per device; none / row: one, on the main device
  std::vector<RankShard> shards;  // every rank's part, rank order (also ranks of other processes)
  // Tensor split over processes (mpirun, process_world.h): this process holds rank process_rank alone, and
  // `ranks` has that one entry. -1: every rank of the mesh is in this process.
  int process_rank = -1;
  // Ranks in separate processes share this process's comm (every process runs the same steps in the same
  // order), so their sessions take this lock around a step. Splits within one process need no lock: each
  // session has its own comm, rank threads and row-split buffers (session_impl.h).
  std::mutex process_step_mutex;
  ModelInfo info;
  // The file's tokenizer, built on first use by Model::tokenizer(); when it cannot be built, tokenizer stays
  // null and tokenizer_error keeps the reason.
  std::once_flag tokenizer_once;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string tokenizer_error;

  // The main device (where an unsplit or row-split model runs) and the first rank's decoder (hparams).
  Device& main_device() const { return *ranks.front().device; }
  const DecoderModel& decoder() const { return *ranks.front().decoder; }
};

}  // namespace tandem
