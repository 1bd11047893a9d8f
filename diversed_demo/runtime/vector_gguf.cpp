// diversed::amx_mm on AVX2, for x86 CPUs with neither AMX nor AVX-512 VNNI: rows [M, K] bf16 times a
// GGUF-quantised weight [N, K] -> [M, N] bf16, on records amx_gguf.py packs for it (the AVX-512 VNNI kernel's
// layout: a block's codes by groups of 4 inputs, one 32-bit lane an output row; 8-bit codes signed here).
// As llama.cpp multiplies a GGUF's blocks on AVX2: each row's block of 32 inputs becomes 32 int8 codes and
// one scale (its largest magnitude / 127), and `vpmaddubsw` multiplies unsigned bytes by signed ones in
// pairs into int16, which `vpmaddwd` adds into int32, exactly; once a block, the sum turns into float32:
// acc += d·dx·Σ q·qx, plus m·dx·Σ qx for 4-bit blocks (d·q + m). 4-bit codes (0..15) are the unsigned side,
// and a block's 8 groups of pairs add up in int16 without saturating; 8-bit codes are signed, so their
// magnitudes are the unsigned side and the inputs take their signs (`vpsignb`), each group widened at once.
// On Zen 3 an added row costs 0.55-0.6 (4-bit) and 0.7 (8-bit) of what float32 FMAs of the GGUF's values
// cost it, and a one-row 4-bit product half (docs/measurements/speed.md, "Integer products on AVX2").
// A row's codes, scale and sums are its own and every output sums its blocks in order, so a row's result
// does not depend on the rows beside it. The codes are made and the outputs rounded 8 lanes at a time: one
// value at a time they had cost about a sixth of an added row (speed.md, "Around the products").
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

namespace {

constexpr int Q4_RECORD = 320, Q8_RECORD = 544;  // bytes a block of 16 rows × 32 inputs takes (amx_gguf.py)
constexpr int ROWS = 8;                          // input rows a block's codes serve from registers
constexpr int AHEAD = 8;                         // blocks prefetched ahead (a few KB)

struct Codes {  // each row's blocks of 32 inputs as int8 codes, with per block its scale
  std::vector<int8_t> codes;    // [M][K]
  std::vector<float> scale;     // [M][K / 32]: dx
  std::vector<float> weighted;  // [M][K / 32]: dx · Σ qx, which a 4-bit block's minima multiply
};

inline __m256 bf16_to_float(const c10::BFloat16* x) {  // 8 values
  const __m256i halfwords = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(halfwords, 16));
}

inline float max_lanes(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

// One block of 32 inputs: its codes (rounded to nearest even), and per block its scale and dx · Σ qx.
inline void quantise_block(const c10::BFloat16* x, int8_t* codes, float* scale, float* weighted) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4], largest = _mm256_setzero_ps();
  for (int c = 0; c < 4; ++c)
    v[c] = bf16_to_float(x + 8 * c), largest = _mm256_max_ps(largest, _mm256_and_ps(v[c], magnitude));
  const float top = max_lanes(largest);
  const __m256 inverse = _mm256_set1_ps(top > 0 ? 127.0f / top : 0.0f);
  __m256i q[4];
  for (int c = 0; c < 4; ++c) q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], inverse));
  // |q| ≤ 127, so the packs do not saturate; they interleave 4-code groups, which the permute puts in order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256((__m256i*)codes, _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i sums = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i total = _mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0x4e));
  total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0xb1));
  *scale = top / 127.0f;
  *weighted = *scale * (float)_mm_cvtsi128_si32(total);
}

constexpr int64_t QUANTISE_GRAIN = 256;  // blocks a thread takes at least: a prompt's rows split, a decode's not

Codes quantise(const c10::BFloat16* x, int64_t M, int64_t K) {  // as the AVX-512 VNNI kernel's
  const int64_t blocks = M * K / 32;
  Codes rows{std::vector<int8_t>(M * K), std::vector<float>(blocks), std::vector<float>(blocks)};
  at::parallel_for(0, blocks, QUANTISE_GRAIN, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      quantise_block(x + 32 * i, rows.codes.data() + 32 * i, &rows.scale[i], &rows.weighted[i]);
  });
  return rows;
}

// 8 float32 lanes as bf16, rounded as c10::BFloat16 rounds them (to nearest even; NaN as 0x7fc0).
inline void store_bf16(c10::BFloat16* out, __m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(values, values, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  const __m256i halves = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0x08);
  _mm_storeu_si128((__m128i*)out, _mm256_castsi256_si128(halves));
}

// A block's 32 inputs times 8 output rows (a record's half s), lane j row j: the codes as the unsigned side
// of `vpmaddubsw`, 8 registers, each 4 inputs.
struct Q4 {
  static constexpr int RECORD = Q4_RECORD;
  __m256i w[8];
  Q4(const uint8_t* record, int s) {  // 64 bytes t: low nibbles inputs 8t..8t+3, high nibbles 8t+4..8t+7
    const __m256i nibble = _mm256_set1_epi8(15);
    for (int t = 0; t < 4; ++t) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(record + 64 * t + 32 * s));
      w[2 * t] = _mm256_and_si256(v, nibble);
      w[2 * t + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
    }
  }
  // pairs of products ≤ 2·15·127 in int16: a block's 8 groups add up to at most 30,480
  __m256i dot(const int32_t* q) const {
    __m256i pairs = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(q[0]));
    for (int u = 1; u < 8; ++u) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[u], _mm256_set1_epi32(q[u])));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  static const uint8_t* scales(const uint8_t* record) { return record + 256; }
};

struct Q8 {
  static constexpr int RECORD = Q8_RECORD;
  __m256i magnitude[8];  // |w| (0..128) for inputs 4u..4u+3
  const uint8_t* codes;
  Q8(const uint8_t* record, int s) : codes(record + 32 * s) {
    for (int u = 0; u < 8; ++u) magnitude[u] = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i*)(codes + 64 * u)));
  }
  // |w| · (x with w's sign): a pair ≤ 2·128·127 fits int16, two do not, so each group widens at once
  __m256i dot(const int32_t* q) const {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sum = _mm256_setzero_si256();
    for (int u = 0; u < 8; ++u) {
      const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(q[u]), _mm256_loadu_si256((const __m256i*)(codes + 64 * u)));
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[u], signed_x), ones));
    }
    return sum;
  }
  static const uint8_t* scales(const uint8_t* record) { return record + 512; }
};

// Output rows 32p..32p+31 for input rows r0..r0+R-1, a quarter (8 rows: record h's half s) at a time over
// all the group's blocks (a group, 30 KB for K = 1536, stays in L2 between quarters): R accumulators.
template <typename Format, int R>
void output_group(const Codes& x, int64_t r0, int64_t K, const uint8_t* group, c10::BFloat16* out, int64_t N,
                  int64_t p) {
  const int64_t blocks = K / 32;
  for (int quarter = 0; quarter < 4; ++quarter) {
    const int h = quarter / 2, s = quarter % 2;
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* record = group + (b * 2 + h) * Format::RECORD;
      if (quarter == 0 && b + AHEAD < blocks)
        for (int line = 0; line < 2 * Format::RECORD; line += 64)
          _mm_prefetch((const char*)(record + AHEAD * 2 * Format::RECORD + line), _MM_HINT_T0);
      const Format w(record, s);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(Format::scales(record) + 16 * s)));
      for (int r = 0; r < R; ++r) {
        const int64_t at = (r0 + r) * blocks + b;
        const __m256 sum = _mm256_cvtepi32_ps(w.dot((const int32_t*)(x.codes.data() + 32 * at)));
        acc[r] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(x.scale[at])), acc[r]);
        if constexpr (Format::RECORD == Q4_RECORD) {  // the minima against the codes, so their rounding cancels
          const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(record + 288 + 16 * s)));
          acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(x.weighted[at]), acc[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) store_bf16(out + (r0 + r) * N + 32 * p + 16 * h + 8 * s, acc[r]);
  }
}

using Group = void (*)(const Codes&, int64_t, int64_t, const uint8_t*, c10::BFloat16*, int64_t, int64_t);

template <typename Format, size_t... R>
constexpr std::array<Group, sizeof...(R)> groups(std::index_sequence<R...>) {
  return {&output_group<Format, R + 1>...};  // entry r - 1: a group of r rows
}

at::Tensor vector_mm(const at::Tensor& rows, const at::Tensor& records) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kBFloat16, "rows must be [M, K] bf16");
  const int64_t size = records.size(-1);
  TORCH_CHECK(records.dim() == 4 && records.size(2) == 2 && (size == Q4_RECORD || size == Q8_RECORD),
              "not packed records");
  const int64_t M = rows.size(0), K = rows.size(1), N = records.size(0) * 32;
  TORCH_CHECK(M >= 1 && K == records.size(1) * 32, "rows of the weight's input width");
  const at::Tensor x = rows.contiguous();
  const Codes codes = quantise(x.data_ptr<c10::BFloat16>(), M, K);
  at::Tensor out = at::empty({M, N}, rows.options());
  const at::Tensor weights = records.contiguous();
  const uint8_t* base = weights.data_ptr<uint8_t>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  static constexpr auto q4 = groups<Q4>(std::make_index_sequence<ROWS>());
  static constexpr auto q8 = groups<Q8>(std::make_index_sequence<ROWS>());
  const auto& by_rows = size == Q4_RECORD ? q4 : q8;
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r0 = 0; r0 < M; r0 += ROWS)  // rows in groups of ROWS, the last of 1..ROWS
        by_rows[std::min<int64_t>(ROWS, M - r0) - 1](codes, r0, K, base + p * (K / 32) * 2 * size, o, N, p);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &vector_mm); }
