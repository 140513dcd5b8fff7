// The trellis GEMV and tiled kernels, written once over a vector type. Included inside
// namespace arbor::cpu::trellis_detail::<isa> by linear_trellis_<isa>.cpp, which first defines
//   TT, TTI   the function attributes of the ISA (TTI: always inline), and
//   struct V  W lanes of f32 (F), zero/loadu/storeu/set1/mul/fmadd/hsum, the register tiles MR1 x NR1
//             (axis 1) and MR0 x NV0 (axis 0), and Block<K>: one 256-weight block of a coded row, built
//             from the block's words (Block<K> b(words)), whose b.template decode<C>() gives the values
//             y = bytesum - 510 (as f32) of weights C*W .. C*W+W-1 in lane order.
// Every loop over a block's 256/W chunks is unrolled at compile time (a fold over the chunk index), so
// each chunk's byte offsets and shifts are constants.
// No guard: it is meant to be included once per ISA namespace.

constexpr int kBlock = 256;
constexpr float kInvStd = 1.0f / 147.800537109375f;  // as quant::trellis_1mad_value
constexpr int kChunks = kBlock / V::W;
using Chunks = std::make_integer_sequence<int, kChunks>;

// ---- GEMV, axis 1: W [N, K] coded along K; each output row reduced over the inputs ------------------
// Chunk C of a block: its W weights times the W inputs of each activation row, into accumulator C % U.
template <int K, int NT, int U, int C>
TTI void axis1_chunk(const typename V::template Block<K>& blk, const float* xb, int64_t Kin, typename V::F (&acc)[NT][U]) {
  const typename V::F w = blk.template decode<C>();
  for (int t = 0; t < NT; ++t) acc[t][C % U] = V::fmadd(w, V::loadu(xb + t * Kin + C * V::W), acc[t][C % U]);
}
template <int K, int NT, int U, int... C>
TTI void axis1_block(const typename V::template Block<K>& blk, const float* xb, int64_t Kin, typename V::F (&acc)[NT][U],
                     std::integer_sequence<int, C...>) {
  (axis1_chunk<K, NT, U, C>(blk, xb, Kin, acc), ...);
}

template <int K, int NT>
TT void gemv_axis1(const Args& a, int64_t n0, int64_t n1) {
  constexpr int wpb = kBlock * K / 32;
  constexpr int U = NT == 1 ? 4 : NT <= 3 ? 2 : 1;  // independent accumulators per row (FMA latency at small T)
  const int64_t Kin = a.w.K, blocks = Kin / kBlock, wpr = blocks * wpb;
  for (int64_t n = n0; n < n1; ++n) {
    typename V::F acc[NT][U];
    for (int t = 0; t < NT; ++t)
      for (int u = 0; u < U; ++u) acc[t][u] = V::zero();
    const uint32_t* row = a.w.words + n * wpr;
    for (int64_t b = 0; b < blocks; ++b) {
      const typename V::template Block<K> blk(row + b * wpb);
      axis1_block<K, NT, U>(blk, a.x + b * kBlock, Kin, acc, Chunks{});
    }
    const float s = a.w.scales[n] * kInvStd, bn = a.bias ? a.bias[n] : 0.0f;
    for (int t = 0; t < NT; ++t) {
      typename V::F sum = acc[t][0];
      for (int u = 1; u < U; ++u) sum = V::add(sum, acc[t][u]);
      a.y[t * a.w.N + n] = V::hsum(sum) * s + bn;
    }
  }
}

// ---- GEMV, axis 0: W stored transposed [K, N], coded along N; coded row r (input r) times x[:, r] is
// added into the outputs. A work item is a slice of coded rows [r0, r1) times a group of output blocks
// [b0, b1): each row's blocks of the group are consecutive words, read in order, and the group's outputs
// (NT x (b1 - b0) x 256 f32, at most 32 KiB) stay in L1 while the rows stream past.
template <int K, int NT, int C>
TTI void axis0_chunk(const typename V::template Block<K>& blk, const typename V::F (&c)[NT], float* acc, int64_t ld) {
  const typename V::F w = blk.template decode<C>();
  for (int t = 0; t < NT; ++t) V::storeu(acc + t * ld + C * V::W, V::fmadd(c[t], w, V::loadu(acc + t * ld + C * V::W)));
}
template <int K, int NT, int... C>
TTI void axis0_block(const typename V::template Block<K>& blk, const typename V::F (&c)[NT], float* acc, int64_t ld,
                     std::integer_sequence<int, C...>) {
  (axis0_chunk<K, NT, C>(blk, c, acc, ld), ...);
}

// dst[t*N + o] for the group's outputs o: set to the bias (or 0), then the rows' products added.
template <int K, int NT>
TT void gemv_axis0(const Args& a, int64_t b0, int64_t b1, int64_t r0, int64_t r1, float* dst, const float* bias) {
  constexpr int wpb = kBlock * K / 32;
  const int64_t Kin = a.w.K, N = a.w.N, wpr = N / kBlock * wpb;
  for (int t = 0; t < NT; ++t)
    for (int64_t o = b0 * kBlock; o < b1 * kBlock; ++o) dst[t * N + o] = bias ? bias[o] : 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float s = a.w.scales[r] * kInvStd;
    typename V::F c[NT];
    for (int t = 0; t < NT; ++t) c[t] = V::set1(a.x[t * Kin + r] * s);
    const uint32_t* row = a.w.words + r * wpr;
    for (int64_t ob = b0; ob < b1; ++ob) {
      const typename V::template Block<K> blk(row + ob * wpb);
      axis0_block<K, NT>(blk, c, dst + ob * kBlock, N, Chunks{});
    }
  }
}

template <int K, int NT>
void gemv_t(ThreadPool& pool, const Args& a) {
  if (a.w.axis == 1) {
    const int64_t grain = std::max<int64_t>(1, 64 * 1024 / std::max<int64_t>(1, a.w.K * K / 8));  // ~64 KiB of words
    pool.parallel_for(a.w.N, grain, [&](int, int64_t n0, int64_t n1) { gemv_axis1<K, NT>(a, n0, n1); });
    return;
  }
  // Groups of output blocks x slices of the coded rows: with fewer groups than twice the threads the rows
  // are split too (slices of at least 128 rows), each slice's partial sums kept apart and added after.
  const int64_t blocks = a.w.N / kBlock, Kin = a.w.K, N = a.w.N;
  const int64_t per_group = std::max(1, 32 / NT), groups = (blocks + per_group - 1) / per_group;
  int64_t slices = 1;
  while (groups * slices < 2 * pool.size() && Kin / (slices * 2) >= 128) slices *= 2;
  auto group = [&](int64_t g, int64_t& b0, int64_t& b1) { b0 = g * per_group, b1 = std::min(blocks, b0 + per_group); };
  if (slices == 1) {
    pool.parallel_for(groups, 1, [&](int, int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        int64_t b0, b1;
        group(g, b0, b1);
        gemv_axis0<K, NT>(a, b0, b1, 0, Kin, a.y, a.bias);
      }
    });
    return;
  }
  thread_local std::vector<float> partial;
  partial.resize(size_t(slices * NT * N));
  float* part = partial.data();  // (the workers' own thread_local copies are not this one)
  const int64_t rows_per = (Kin + slices - 1) / slices;
  pool.parallel_for(groups * slices, 1, [&](int, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t sl = i / groups, r0 = sl * rows_per, r1 = std::min(Kin, r0 + rows_per);
      int64_t b0, b1;
      group(i % groups, b0, b1);
      gemv_axis0<K, NT>(a, b0, b1, r0, r1, part + sl * NT * N, sl == 0 ? a.bias : nullptr);
    }
  });
  for (int64_t j = 0; j < NT * N; ++j) {
    float s = part[j];
    for (int64_t sl = 1; sl < slices; ++sl) s += part[sl * NT * N + j];
    a.y[j] = s;
  }
}

template <int K>
void gemv_k(ThreadPool& pool, const Args& a) {
  switch (a.T) {
    case 1: return gemv_t<K, 1>(pool, a);
    case 2: return gemv_t<K, 2>(pool, a);
    case 3: return gemv_t<K, 3>(pool, a);
    case 4: return gemv_t<K, 4>(pool, a);
    case 5: return gemv_t<K, 5>(pool, a);
    case 6: return gemv_t<K, 6>(pool, a);
    case 7: return gemv_t<K, 7>(pool, a);
    case 8: return gemv_t<K, 8>(pool, a);
  }
  fail("trellis gemv: {} rows (1..8)", a.T);
}

void gemv_impl(ThreadPool& pool, const Args& a) {
  switch (a.w.k) {
    case 2: return gemv_k<2>(pool, a);
    case 3: return gemv_k<3>(pool, a);
    case 4: return gemv_k<4>(pool, a);
  }
  fail("trellis gemv: k = {} (2, 3, 4)", a.w.k);
}

// ---- Tiled: decode once to f32, reuse across the activation rows ----------------------------------------
// A coded row's weights in f32 exactly as the reference decodes them: (y * 1/147.8) * scale.
template <int K, int C>
TTI void decode_chunk(const typename V::template Block<K>& blk, typename V::F inv, typename V::F s, float* out) {
  V::storeu(out + C * V::W, V::mul(V::mul(blk.template decode<C>(), inv), s));
}
template <int K, int... C>
TTI void decode_block(const typename V::template Block<K>& blk, typename V::F inv, typename V::F s, float* out,
                      std::integer_sequence<int, C...>) {
  (decode_chunk<K, C>(blk, inv, s, out), ...);
}
template <int K>
TT void decode_row(const uint32_t* row, int64_t cols, float scale, float* out) {
  constexpr int wpb = kBlock * K / 32;
  const typename V::F inv = V::set1(kInvStd), s = V::set1(scale);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const typename V::template Block<K> blk(row + b * wpb);
    decode_block<K>(blk, inv, s, out + b * kBlock, Chunks{});
  }
}

// Axis 1: y[i, j] = x[i, :] · P[j, :] (+ bias[j]) for an MR x NR tile; P a decoded panel [NR.., Kin].
template <int MR, int NR>
TT void tile_axis1(const float* x, int64_t Kin, const float* P, float* y, int64_t ldy, const float* bias) {
  typename V::F acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
  for (int64_t kk = 0; kk < Kin; kk += V::W) {
    typename V::F w[NR];
    for (int j = 0; j < NR; ++j) w[j] = V::loadu(P + j * Kin + kk);
    for (int i = 0; i < MR; ++i) {
      const typename V::F xv = V::loadu(x + i * Kin + kk);
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fmadd(xv, w[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = V::hsum(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

template <int MR>
TT void tile_axis1_nr(int nr, const float* x, int64_t Kin, const float* P, float* y, int64_t ldy, const float* bias) {
  static_assert(V::NR1 <= 4);
  switch (nr) {
    case 1: return tile_axis1<MR, 1>(x, Kin, P, y, ldy, bias);
    case 2: return tile_axis1<MR, 2>(x, Kin, P, y, ldy, bias);
    case 3: return tile_axis1<MR, std::min(3, V::NR1)>(x, Kin, P, y, ldy, bias);
    case 4: return tile_axis1<MR, std::min(4, V::NR1)>(x, Kin, P, y, ldy, bias);
  }
}

template <int K>
void tiled_axis1(ThreadPool& pool, const Args& a) {
  constexpr int NB = 4 * V::NR1;  // panel rows
  const int64_t Kin = a.w.K, N = a.w.N, T = a.T, wpr = Kin / kBlock * (kBlock * K / 32);
  pool.parallel_for((N + NB - 1) / NB, 1, [&](int, int64_t p0, int64_t p1) {
    thread_local std::vector<float> panel;
    panel.resize(size_t(NB * Kin));
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * NB, nb = std::min<int64_t>(NB, N - n0);
      for (int64_t j = 0; j < nb; ++j) decode_row<K>(a.w.words + (n0 + j) * wpr, Kin, a.w.scales[n0 + j], panel.data() + j * Kin);
      for (int64_t j = 0; j < nb; j += V::NR1) {
        const int nr = int(std::min<int64_t>(V::NR1, nb - j));
        const float* P = panel.data() + j * Kin;
        const float* bias = a.bias ? a.bias + n0 + j : nullptr;
        int64_t t = 0;
        for (; t + V::MR1 <= T; t += V::MR1) tile_axis1_nr<V::MR1>(nr, a.x + t * Kin, Kin, P, a.y + t * N + n0 + j, N, bias);
        for (; t < T; ++t) tile_axis1_nr<1>(nr, a.x + t * Kin, Kin, P, a.y + t * N + n0 + j, N, bias);
      }
    }
  });
}

// Axis 0: y[i, o..] += sum_r x[i, r] * tile[r, o..] for an MR x (NV*W) tile of outputs.
template <int MR, int NV>
TT void tile_axis0(const float* x, int64_t Kin, const float* tile, int rb, float* y, int64_t ldy) {
  typename V::F acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = V::loadu(y + i * ldy + v * V::W);
  for (int r = 0; r < rb; ++r) {
    typename V::F w[NV];
    for (int v = 0; v < NV; ++v) w[v] = V::loadu(tile + r * kBlock + v * V::W);
    for (int i = 0; i < MR; ++i) {
      const typename V::F xb = V::set1(x[i * Kin + r]);
      for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(xb, w[v], acc[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) V::storeu(y + i * ldy + v * V::W, acc[i][v]);
}

template <int K>
void tiled_axis0(ThreadPool& pool, const Args& a) {
  constexpr int RB = 64;  // coded rows (inputs) per decoded tile: 64 x 256 f32 = 64 KiB
  constexpr int OW = V::NV0 * V::W;
  static_assert(kBlock % OW == 0);
  const int64_t Kin = a.w.K, N = a.w.N, T = a.T, wpr = N / kBlock * (kBlock * K / 32);
  pool.parallel_for(N / kBlock, 1, [&](int, int64_t b0, int64_t b1) {
    thread_local std::vector<float> tile;
    tile.resize(size_t(RB * kBlock));
    for (int64_t ob = b0; ob < b1; ++ob) {
      for (int64_t t = 0; t < T; ++t)
        for (int o = 0; o < kBlock; ++o) a.y[t * N + ob * kBlock + o] = a.bias ? a.bias[ob * kBlock + o] : 0.0f;
      for (int64_t r0 = 0; r0 < Kin; r0 += RB) {
        const int rb = int(std::min<int64_t>(RB, Kin - r0));
        for (int r = 0; r < rb; ++r)
          decode_row<K>(a.w.words + (r0 + r) * wpr + ob * (kBlock * K / 32), kBlock, a.w.scales[r0 + r], tile.data() + r * kBlock);
        for (int o = 0; o < kBlock; o += OW) {
          float* yo = a.y + ob * kBlock + o;
          int64_t t = 0;
          for (; t + V::MR0 <= T; t += V::MR0) tile_axis0<V::MR0, V::NV0>(a.x + t * Kin + r0, Kin, tile.data() + o, rb, yo + t * N, N);
          for (; t < T; ++t) tile_axis0<1, V::NV0>(a.x + t * Kin + r0, Kin, tile.data() + o, rb, yo + t * N, N);
        }
      }
    }
  });
}

void tiled_impl(ThreadPool& pool, const Args& a) {
  switch (a.w.k * 2 + a.w.axis) {
    case 4: return tiled_axis0<2>(pool, a);
    case 5: return tiled_axis1<2>(pool, a);
    case 6: return tiled_axis0<3>(pool, a);
    case 7: return tiled_axis1<3>(pool, a);
    case 8: return tiled_axis0<4>(pool, a);
    case 9: return tiled_axis1<4>(pool, a);
  }
  fail("trellis tiled: k = {} axis {} (k 2, 3, 4; axis 0, 1)", a.w.k, a.w.axis);
}
