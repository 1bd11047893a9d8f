// diversed::amx_mm on AVX-512 VNNI, for x86 CPUs without AMX (AMD Zen 4 and later): rows [M, K] bf16 times a
// GGUF-quantised weight [N, K] -> [M, N] bf16, on records amx_gguf.py packs for it (`VNNI_LAYOUT`). As
// llama.cpp multiplies a GGUF's blocks on a CPU: each row's block of 32 inputs becomes 32 int8 codes and one
// float32 scale (its largest magnitude / 127), and one integer dot-product instruction (`vpdpbusd`) adds four
// products of the weight's unsigned codes and the inputs' codes in each of 16 lanes, one lane an output row.
// A block of 16 output rows sums its 32 inputs in 8 such instructions, exactly in int32, then turns into
// float32 once: acc += d·dx·Σ q·qx, plus m·dx·Σ qx for 4-bit blocks (d·q + m); 8-bit codes are stored
// offset by 128 (unsigned), taken off as 128·Σ qx. The weights' codes are used as stored (no conversion per
// row pair, as the bf16 dot products needed), twice the products an instruction, so a pass over a few tokens
// costs little more than one (docs/measurements/speed.md, "The GGUF kernel on AVX-512 VNNI").
// A row's codes, scale and sums are its own and every output sums its blocks in order, so a row's result
// does not depend on the rows beside it.
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
constexpr int ROWS = 8;                          // input rows a block's weights serve in registers
constexpr int AHEAD = 8;                         // records prefetched ahead (a few KB)

struct Rows {  // each row's blocks of 32 inputs as int8 codes, with per block its scale and the codes' sum
  std::vector<int8_t> codes;    // [M][K]
  std::vector<float> scale;     // [M][K / 32]: dx
  std::vector<float> weighted;  // [M][K / 32]: dx · Σ qx, which a 4-bit block's minima multiply
  std::vector<int32_t> offset;  // [M][K / 32]: 128 · Σ qx, what an 8-bit block's stored offset adds
};

// acc + w · (4 codes at q, in every lane): the inputs broadcast from memory within the instruction
inline __m512i dot4(__m512i acc, __m512i w, const int32_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*q));
  return acc;
}

inline __m512 bf16_to_float(__m256i halfwords) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halfwords), 16));
}

Rows quantise(const c10::BFloat16* x, int64_t M, int64_t K) {
  const int64_t blocks = M * K / 32;
  Rows rows{std::vector<int8_t>(M * K), std::vector<float>(blocks), std::vector<float>(blocks),
            std::vector<int32_t>(blocks)};
  for (int64_t i = 0; i < blocks; ++i) {
    const __m512i raw = _mm512_loadu_si512((const void*)(x + 32 * i));
    const __m512 low = bf16_to_float(_mm512_castsi512_si256(raw));
    const __m512 high = bf16_to_float(_mm512_extracti64x4_epi64(raw, 1));
    const float largest = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
    const __m512 inverse = _mm512_set1_ps(largest > 0 ? 127.0f / largest : 0.0f);
    const __m512i q_low = _mm512_cvtps_epi32(_mm512_mul_ps(low, inverse));  // rounded to nearest even
    const __m512i q_high = _mm512_cvtps_epi32(_mm512_mul_ps(high, inverse));
    _mm_storeu_si128((__m128i*)(rows.codes.data() + 32 * i), _mm512_cvtsepi32_epi8(q_low));
    _mm_storeu_si128((__m128i*)(rows.codes.data() + 32 * i + 16), _mm512_cvtsepi32_epi8(q_high));
    const int32_t total = _mm512_reduce_add_epi32(_mm512_add_epi32(q_low, q_high));
    rows.scale[i] = largest / 127.0f;
    rows.weighted[i] = rows.scale[i] * (float)total;
    rows.offset[i] = 128 * total;
  }
  return rows;
}

// Output rows 32p..32p+31 (a group's two halves of 16) for input rows r0..r0+R-1, into lanes [R][32].
template <bool Q4, int R>
void output_group(const Rows& x, int64_t r0, int64_t K, const uint8_t* group, float* lanes) {
  constexpr int RECORD = Q4 ? Q4_RECORD : Q8_RECORD;
  const int64_t blocks = K / 32;
  const __m512i nibble = _mm512_set1_epi8(15);
  __m512 acc[2][R];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) acc[h][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b)
    for (int h = 0; h < 2; ++h) {
      const uint8_t* record = group + (b * 2 + h) * RECORD;
      if (b + AHEAD < blocks)
        for (int line = 0; line < RECORD; line += 64)
          _mm_prefetch((const char*)(record + AHEAD * 2 * RECORD + line), _MM_HINT_T0);
      // w[u]: 16 rows × inputs 4u..4u+3 of the block, lane j row j
      __m512i w[8];
      if constexpr (Q4) {  // 64 bytes: low nibbles inputs 8t..8t+3, high nibbles 8t+4..8t+7
        for (int t = 0; t < 4; ++t) {
          const __m512i v = _mm512_loadu_si512((const void*)(record + 64 * t));
          w[2 * t] = _mm512_and_si512(v, nibble);
          w[2 * t + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        }
      } else {
        for (int u = 0; u < 8; ++u) w[u] = _mm512_loadu_si512((const void*)(record + 64 * u));
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(record + (Q4 ? 256 : 512))));
      const __m512 m = Q4 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(record + 288))) : d;
      for (int r = 0; r < R; ++r) {
        const int64_t at = (r0 + r) * blocks + b;
        const int32_t* q = (const int32_t*)(x.codes.data() + 32 * at);  // 8 groups of 4 codes
        __m512i even = dot4(_mm512_setzero_si512(), w[0], q), odd = dot4(_mm512_setzero_si512(), w[1], q + 1);
        for (int u = 2; u < 8; u += 2) even = dot4(even, w[u], q + u), odd = dot4(odd, w[u + 1], q + u + 1);
        __m512i sum = _mm512_add_epi32(even, odd);
        if constexpr (!Q4) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(x.offset[at]));
        acc[h][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(x.scale[at])), acc[h][r]);
        if constexpr (Q4)  // the minima against the inputs' codes, so that their rounding cancels
          acc[h][r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x.weighted[at]), acc[h][r]);
      }
    }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(lanes + r * 32 + 16 * h, acc[h][r]);
}

using Group = void (*)(const Rows&, int64_t, int64_t, const uint8_t*, float*);

template <bool Q4, size_t... R>
constexpr std::array<Group, sizeof...(R)> groups(std::index_sequence<R...>) {
  return {&output_group<Q4, R + 1>...};  // entry r - 1: a group of r rows
}

at::Tensor vnni_mm(const at::Tensor& rows, const at::Tensor& records) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kBFloat16, "rows must be [M, K] bf16");
  const int64_t size = records.size(-1);
  TORCH_CHECK(records.dim() == 4 && records.size(2) == 2 && (size == Q4_RECORD || size == Q8_RECORD),
              "not packed records");
  const int64_t M = rows.size(0), K = rows.size(1), N = records.size(0) * 32;
  TORCH_CHECK(M >= 1 && K == records.size(1) * 32, "rows of the weight's input width");
  const at::Tensor x = rows.contiguous();
  const Rows quantised = quantise(x.data_ptr<c10::BFloat16>(), M, K);
  at::Tensor out = at::empty({M, N}, rows.options());
  const at::Tensor weights = records.contiguous();
  const uint8_t* base = weights.data_ptr<uint8_t>();
  c10::BFloat16* o = out.data_ptr<c10::BFloat16>();
  static constexpr auto q4 = groups<true>(std::make_index_sequence<ROWS>());
  static constexpr auto q8 = groups<false>(std::make_index_sequence<ROWS>());
  const auto& by_rows = size == Q4_RECORD ? q4 : q8;
  at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float lanes[ROWS * 32];
    for (int64_t p = begin; p < end; ++p)
      for (int64_t r0 = 0; r0 < M; r0 += ROWS) {  // rows in groups of ROWS, the last of 1..ROWS
        const int64_t count = std::min<int64_t>(ROWS, M - r0);
        by_rows[count - 1](quantised, r0, K, base + p * (K / 32) * 2 * size, lanes);
        for (int64_t r = 0; r < count; ++r)
          _mm256_storeu_si256((__m256i*)(o + (r0 + r) * N + 32 * p),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(lanes + 32 * r)));  // rounded once
        for (int64_t r = 0; r < count; ++r)
          _mm256_storeu_si256((__m256i*)(o + (r0 + r) * N + 32 * p + 16),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(lanes + 32 * r + 16)));
      }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &vnni_mm); }
