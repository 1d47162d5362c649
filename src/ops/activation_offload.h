// layout.activation_offload: where full recompute's kept chunk inputs (one [T_s, H] tensor a
// chunk of layers, the only activations a chunk keeps through the forward) wait between the
// chunk's forward and its recompute in the backward. Offloaded, each goes to host memory
// once the layer before has written it and comes back before its chunk is recomputed, on a
// copy stream beside the layers' compute; the device holds three slots in turn (the chunk
// being read, the next one being written or fetched, the one before going to the host),
// not one tensor a chunk. The inputs' values are not touched, so a run is bit for bit the
// same with and without it (model/decoder.h set_activation_offload).
//
// Two twins: the CUDA one (ops/cuda/activation_offload.h, pinned host memory, events between
// the compute and copy streams) and the CPU one here, whose "device" slots and host copies
// are separate host buffers and which poisons a slot (NaN) each time it hands it out again,
// so that a CPU run reading a chunk input that had left its slot would show it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "core/tensor.h"

namespace loom {

class ActivationOffload {
 public:
  static constexpr size_t kNone = std::numeric_limits<size_t>::max();
  static constexpr int kSlots = 3;

  virtual ~ActivationOffload() = default;
  // A device tensor for chunk `index`'s input: slot index % kSlots. The device work queued
  // after this call waits until the slot's previous chunk has gone to the host.
  virtual Tensor slot(size_t index, Shape shape, DType dtype) = 0;
  // Chunk index's input is in its slot once the work queued so far has run: copies it to
  // host memory, beside the work queued next (which may read the slot, not write it).
  virtual void to_host(size_t index) = 0;
  // Chunk index's input back in its slot before the work queued next runs (its copy started
  // here, unless an earlier call's `prefetch` started it); then starts the copy of chunk
  // `prefetch` (kNone: none) into its own slot, beside the work queued next, once the work
  // queued so far is done with that slot.
  virtual Tensor from_host(size_t index, size_t prefetch) = 0;
  // The host memory the inputs take, and the device slots'.
  virtual int64_t host_bytes() const = 0;
  virtual int64_t device_bytes() const = 0;
};

// The CPU twin (above).
std::unique_ptr<ActivationOffload> cpu_activation_offload();

}  // namespace loom
