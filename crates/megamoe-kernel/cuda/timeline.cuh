// timeline.cuh -- on request, what a GEMM's CTAs did when, and at what SM clock: each CTA appends
// an event per tile to its own run of a device buffer, which the host reads after the stream
// (timeline.rs; `megamoe bench --timeline`, where the fused forward's stages come from its stage
// clock). Off (a null Timeline), a record is a branch not taken.
#pragma once

#include "barriers.cuh"
#include "sm90_ptx.cuh"

namespace mm {
namespace timeline {

typedef unsigned int u32;
typedef unsigned long long u64;

struct Event {
  // %globaltimer ns: a tile's hand-out by the producer (its first load) .. the consumers' end of it
  // (their epilogue, or its hand-over to the epilogue warps).
  u64 start_ns, end_ns;
  u32 kind, sm;  // kind: the Timeline's tile_kind
  int expert;    // of this rank's
  int row0, rows;       // its first pool row, its rows
  int n_col, k_blocks;  // its first weight row, its k128 blocks
  u32 sm_cycles;        // the SM's cycles from start_ns to end_ns (its clock over the tile)
};
static_assert(sizeof(Event) == 48, "Event layout (megamoe-kernel/src/timeline.rs)");

struct Timeline {
  Event* events;  // [grid][per_cta]
  u32* cursors;   // [grid]: events each CTA appended (past per_cta dropped, but counted)
  u32 per_cta;
  u32 tile_kind;  // what the tiles of the GEMM this timeline is handed to are (timeline.rs `EventKind`)
};
static_assert(sizeof(Timeline) == 24, "Timeline layout (megamoe-kernel/src/timeline.rs)");

__device__ __forceinline__ u64 now() { return barriers::ptx::globaltimer(); }

// Appends e to this CTA's run. One thread of a CTA appends at a time.
__device__ __forceinline__ void append(const Timeline* tl, const Event& e) {
  const u32 cta = sm90::fresh_ctaid_x();  // afresh: nothing held across the roles
  const u32 i = atomicAdd(tl->cursors + cta, 1u);
  if (i < tl->per_cta) tl->events[(size_t)cta * tl->per_cta + i] = e;
}

// A GEMM unit (its descriptor: row0, rows, n_col, kb_range, .., expert, handed_ns, handed_cycles)
// done now, on SM `sm`, where it was handed out: an event from its hand-out (the timer's low 32
// bits then, less than 2^32 ns ago; the cycle counter's, less than 2^32 cycles ago).
template <class Unit>
__device__ __forceinline__ void tile_done(const Timeline* tl, const Unit& d, u32 sm) {
  const u64 end = now();
  const u32 cycles = sm90::sm_cycles() - d.handed_cycles;
  const u64 handed = end - (u32)((u32)end - d.handed_ns);
  append(tl, Event{handed, end, tl->tile_kind, sm, d.expert, d.row0, d.rows, d.n_col,
                   (int)(d.kb_range >> 16) - (int)(d.kb_range & 0xffff), cycles});
}

}  // namespace timeline
}  // namespace mm
