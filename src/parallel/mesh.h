// A mesh: the devices one model runs on and how it is split over them (DESIGN.md "Mesh and comm").
//
//   none    the whole model on one device (the main device of the list)
//   layer   contiguous ranges of layers per device (pipeline); the hidden state hops at range boundaries
//   row     every weight matrix but the token embedding split by output rows over the devices, results
//           gathered on the main device; attention, norms and the KV cache stay on the main device
//           (llama.cpp's older "row" mode)
//   tensor  Megatron-style: one rank per device (a host thread, or a process under mpirun) holding a shard of
//           every matrix and of the KV heads; partial sums are combined by an all-reduce
// src/parallel/shard_rules.h has the per-tensor rules of each mode.
//
// Everything here is checked before any weight is loaded, with messages that name the flag and the value.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem {

enum class SplitMode { None, Layer, Row, Tensor };

// "none", "layer", "row", "tensor".
const char* split_mode_name(SplitMode mode);
// Parses a --split-mode value. Error: "--split-mode: unknown mode 'x'; expected none, layer, row or tensor".
SplitMode parse_split_mode(const std::string& s);

// Parses one device name: "cpu", "cpu:N", "cuda" or "cuda:N" ("cpu" / "cuda" alone mean index 0). Errors
// start with `flag` ("--device: unknown device 'gpu'; expected cpu, cpu:N, cuda or cuda:N").
DeviceId parse_device_id(const std::string& s, const std::string& flag);

// Parses a --devices list: "cuda:0,cuda:1", "cpu:0,cpu:1,cpu:2"; "cpu" / "cuda" alone mean index 0.
// Errors name the entry: an empty list or entry, an unknown kind, a bad index, a CPU device listed twice (a
// GPU may repeat: ranks sharing it). Does not check that the devices exist (see check_devices_exist).
std::vector<DeviceId> parse_device_list(const std::string& s);

// Parses --tensor-split ratios ("3,1", "0.5,0.5") for n_devices devices and returns them normalised to sum 1.
// An empty string gives equal ratios. Errors: not a number, negative, NaN or infinite, a count different from
// n_devices, all zero.
std::vector<double> parse_tensor_split(const std::string& s, size_t n_devices);

// Throws Error for a device that is not present: a CUDA device in a build without CUDA ("this build of tandem
// has no CUDA support"), cuda:N with N >= the number of GPUs ("device cuda:3 does not exist: this machine has
// 1 CUDA device (cuda:0)"). CPU devices always exist (cpu:N are separate CPU "devices" in one process).
void check_devices_exist(const std::vector<DeviceId>& devices);

struct MeshSpec {
  std::vector<DeviceId> devices;  // rank r runs on devices[r]; size 1 for none
  SplitMode mode = SplitMode::None;
  std::vector<double> ratios;  // one per device, sum 1 (layer, row, tensor)
  int main_device = 0;         // index into devices: none runs there; row gathers there; logits land there
  bool replicate_kv = false;   // tensor: allow more ranks than KV heads by giving several ranks a copy
  bool ratios_given = false;   // --tensor-split was given; else ratios are equal (a layer split on GPUs then
                               // rebalances them by free memory)

  size_t n_ranks() const { return devices.size(); }
  // "tensor over cpu:0,cpu:1 (ratios 0.5,0.5)", "none on cuda:0".
  std::string describe() const;
};

// Builds and checks a mesh from the command-line values:
//   devices         --devices list; empty = {default_device}
//   mode            --split-mode; empty = none
//   tensor_split    --tensor-split; empty = equal
//   main_device     --main-device, an index into the device list
//   replicate_kv    --replicate-kv
//   default_device  the one device without --devices (ModelParams::device)
// With mode none and several devices, only devices[main_device] is used. With a split mode and one device the
// mesh has one rank (valid, nothing to split). Mixing CPU and CUDA devices in one mesh is an Error. Devices
// must exist (check_devices_exist). main_device out of range, ratios of the wrong count: Error.
MeshSpec make_mesh_spec(const std::string& devices, const std::string& mode, const std::string& tensor_split,
                        int main_device, bool replicate_kv, DeviceId default_device);

}  // namespace tandem
