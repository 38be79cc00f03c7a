// Mapping CTAs to work: grouped rasterization of output tiles, split-k ranges and the
// stream-k even split of MAC iterations. Pure integer math, no memory traffic.
#pragma once
#include "../arch.cuh"
#include "../params.cuh"

namespace pyblasgemm {

struct TileCoord {
  int b, tm, tn;  // batch index, tile row, tile column
};

template <int BM, int BN, int BKE>
struct TileScheduler {
  int tiles_m, tiles_n, tiles_per_batch, kt;  // kt = BK steps per tile (ceil(k / BK))

  PBG_DEVICE explicit TileScheduler(const GemmParams& p) {
    tiles_m = (p.m + BM - 1) / BM;
    tiles_n = (p.n + BN - 1) / BN;
    tiles_per_batch = tiles_m * tiles_n;
    kt = (p.k + BKE - 1) / BKE;
  }

  // Grouped raster: consecutive CTAs walk `group` tile rows down one tile column before moving
  // right, so a wave touches ~sqrt(wave) A row-panels and B column-panels and they stay in L2.
  PBG_DEVICE TileCoord coord(int tile, int group) const {
    TileCoord c;
    c.b = tile / tiles_per_batch;
    int lin = tile - c.b * tiles_per_batch;
    int width = group * tiles_n;
    int gid = lin / width;
    int first_m = gid * group;
    int gsize = tiles_m - first_m < group ? tiles_m - first_m : group;
    int r = lin - gid * width;
    c.tm = first_m + r % gsize;
    c.tn = r / gsize;
    return c;
  }

  // Stream-k: T iterations over G CTAs, CTA c owns [c*T/G, (c+1)*T/G). With G <= T every
  // range is non-empty, which the owner's wait loop relies on.
  static PBG_DEVICE i64 sk_begin(int c, i64 total, int ctas) { return (static_cast<i64>(c) * total) / ctas; }
  // The CTA whose range holds iteration `it` (largest c with sk_begin(c) <= it).
  static PBG_DEVICE int sk_cta_of(i64 it, i64 total, int ctas) {
    return static_cast<int>(((it + 1) * ctas + total - 1) / total) - 1;
  }
};

}  // namespace pyblasgemm
