// The split flags of generate, perplexity and bench (split_options.h).
#include "split_options.h"

#include <memory>

#include "core/error.h"

namespace tandem::cli {

void add_split_options(CLI::App* cmd, SplitOptions* o) {
  cmd->add_option("--devices", o->devices,
                  "Devices to run the model on, comma-separated: cuda:0,cuda:1 or cpu:0,cpu:1 (several CPU "
                  "devices in one process); empty: one device")
      ->group("Multi-device");
  cmd->add_option(
         "--split-mode", o->split_mode,
         "How to split the model over --devices: none (main device only), layer (ranges of layers per "
         "device), row (matrices split by rows, gathered on the main device) or tensor (Megatron-style "
         "tensor parallelism)")
      ->group("Multi-device");
  cmd->add_option("--tensor-split", o->tensor_split,
                  "Share of the model per device, one ratio per device of --devices, e.g. 3,1 (empty: equal)")
      ->group("Multi-device");
  cmd->add_option("--main-device", o->main_device,
                  "Index into --devices of the main device (none runs there, row gathers there, logits land "
                  "there)")
      ->group("Multi-device");
  cmd->add_flag("--replicate-kv", o->replicate_kv,
                "tensor split over more devices than KV heads: give several devices a copy of a KV head")
      ->group("Multi-device");
}

MeshSpec apply(const SplitOptions& o, ModelParams& mp) {
  mp.devices = o.devices;
  mp.split_mode = o.split_mode;
  mp.tensor_split = o.tensor_split;
  mp.main_device = o.main_device;
  mp.replicate_kv = o.replicate_kv;
  // The default device is one device name ("cpu", "cuda:1").
  DeviceId dflt;
  try {
    dflt = parse_device_id(mp.device, "device");
  } catch (const Error&) {
    throw Error("device '" + mp.device + "': expected one device: cpu, cpu:N, cuda or cuda:N");
  }
  auto mesh = std::make_shared<const MeshSpec>(
      make_mesh_spec(mp.devices, mp.split_mode, mp.tensor_split, mp.main_device, mp.replicate_kv, dflt));
  mp.mesh = mesh;
  return *mesh;
}

}  // namespace tandem::cli
