// diversed::amx_mm: rows [M, K] bf16 times a GGUF-quantised weight [N, K] -> [M, N] bf16, with Intel AMX.
//
// The weight streams as stored: 4-bit codes (Q4_0/Q4_1 projections) or 8-bit ones (a Q8_0 LM head). Per
// block of 16 output rows x 32 inputs the codes become the exact bf16 weights (d·q + m rounded once, as the
// dense bf16 model holds them), and one AMX tile product multiplies them by all M rows at once. The codes
// are unpacked once whatever M is, so a pass over 8 tokens costs about what a pass over one does; every
// output element is computed the same way whatever M is, so a row's result does not depend on the rows
// beside it.
//
// Layout (amx_gguf.py packs it): records [N/32, K/32, 2, size] bytes, one per block of 16 rows (two row
// groups side by side, so a thread streams one array). 4-bit, 320 bytes: 256 of codes (byte 32i + k holds
// row 2i's code for input k in its low nibble, row 2i+1's in its high nibble), 16 fp16 scales d, 16 fp16
// minima m. 8-bit, 544 bytes: 512 signed codes (row-major), 16 fp16 scales d.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <torch/library.h>
#include <unistd.h>

#define FENCE asm volatile("" ::: "memory")  // GCC's tile intrinsics declare no memory operands

namespace {

constexpr int Q4_RECORD = 320, Q8_RECORD = 544;
constexpr int AHEAD = 4;  // blocks prefetched ahead

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: the outputs of two row groups (16 x M fp32); 2, 3: their weights (16 rows x 32 bf16);
// 4: the rows' inputs for one block, in AMX's pair layout (16 input pairs x M).
void configure(int64_t M) {
  TileConfig cfg;
  for (int t : {0, 1, 4}) cfg.rows[t] = 16, cfg.colsb[t] = 4 * M;
  for (int t : {2, 3}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

// One 4-bit record's 16 x 32 codes as bf16 weights, row-major, into `a`: a 16-entry table per row.
inline void dequantise_q4(const uint8_t* record, uint16_t* a) {
  alignas(64) float d[16], m[16];
  _mm512_store_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(record + 256))));
  _mm512_store_ps(m, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(record + 288))));
  const __m512 codes = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i low = _mm512_set1_epi16(15), upper = _mm512_set1_epi16(16);
  for (int i = 0; i < 8; ++i) {
    __m512 even = _mm512_fmadd_ps(codes, _mm512_set1_ps(d[2 * i]), _mm512_set1_ps(m[2 * i]));
    __m512 odd = _mm512_fmadd_ps(codes, _mm512_set1_ps(d[2 * i + 1]), _mm512_set1_ps(m[2 * i + 1]));
    __m512i table = (__m512i)_mm512_cvtne2ps_pbh(odd, even);  // words 0..15: row 2i, 16..31: row 2i+1
    __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(record + 32 * i)));
    __m512i index_even = _mm512_and_si512(bytes, low);
    __m512i index_odd = _mm512_or_si512(_mm512_srli_epi16(bytes, 4), upper);
    _mm512_store_si512((__m512i*)(a + 64 * i), _mm512_permutexvar_epi16(index_even, table));
    _mm512_store_si512((__m512i*)(a + 64 * i + 32), _mm512_permutexvar_epi16(index_odd, table));
  }
}

// One 8-bit record's 16 x 32 codes as bf16 weights, row-major, into `a`.
inline void dequantise_q8(const uint8_t* record, uint16_t* a) {
  alignas(64) float d[16];
  _mm512_store_ps(d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(record + 512))));
  for (int row = 0; row < 16; ++row) {
    const __m512 scale = _mm512_set1_ps(d[row]);
    const uint8_t* codes = record + 32 * row;
    __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)codes)));
    __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(codes + 16))));
    __m512i weights = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(high, scale), _mm512_mul_ps(low, scale));
    _mm512_store_si512((__m512i*)(a + 32 * row), weights);
  }
}

// Output columns [32 p0, 32 p1) for all M rows.
template <int RECORD, void (*dequantise)(const uint8_t*, uint16_t*)>
void row_pairs(const uint32_t* inputs, int64_t M, int64_t K, const uint8_t* records, c10::BFloat16* out,
               int64_t N, int64_t p0, int64_t p1) {
  configure(M);
  const int64_t blocks = K / 32;
  alignas(64) uint16_t weights[2][16 * 32];
  alignas(64) float results[16 * 16];
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t p = p0; p < p1; ++p) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* record = records + (p * blocks + b) * 2 * RECORD;
      for (int line = 0; line < 2 * RECORD; line += 64)
        _mm_prefetch((const char*)(record + AHEAD * 2 * RECORD + line), _MM_HINT_T0);
      _tile_loadd(4, inputs + b * 16 * M, 4 * M);
      dequantise(record, weights[0]);
      dequantise(record + RECORD, weights[1]);
      FENCE;
      _tile_loadd(2, weights[0], 64);
      _tile_loadd(3, weights[1], 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 3, 4);
    }
    for (int g = 0; g < 2; ++g) {
      if (g == 0) _tile_stored(0, results, 4 * M);
      else _tile_stored(1, results, 4 * M);
      FENCE;
      const __m512i column = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(M));  // results are [16 rows][M]
      for (int64_t r = 0; r < M; ++r) {
        __m512 values = _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32(r)), results, 4);
        _mm256_storeu_si256((__m256i*)(out + r * N + (2 * p + g) * 16), (__m256i)_mm512_cvtneps_pbh(values));
      }
    }
  }
  _tile_release();
}

bool amx_permitted() {  // Linux lends a process the tile registers only on request (ARCH_REQ_XCOMP_PERM)
  static const bool permitted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return permitted;
}

at::Tensor amx_mm(const at::Tensor& rows, const at::Tensor& records) {
  TORCH_CHECK(amx_permitted(), "the kernel cannot use AMX here");
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kBFloat16, "rows must be [M, K] bf16");
  const int64_t size = records.size(-1);
  TORCH_CHECK(records.dim() == 4 && records.size(2) == 2 && (size == Q4_RECORD || size == Q8_RECORD),
              "not packed records");
  const int64_t M = rows.size(0), K = rows.size(1), N = records.size(0) * 32;
  TORCH_CHECK(M >= 1 && M <= 16 && K == records.size(1) * 32, "1..16 rows of the weight's input width");
  at::Tensor x = rows.contiguous();
  at::Tensor inputs = at::empty({K / 2, M}, x.options().dtype(at::kInt));  // [input pair][row]
  auto source = (const uint32_t*)x.data_ptr();
  auto pairs = (uint32_t*)inputs.data_ptr();
  for (int64_t k = 0; k < K / 2; ++k)
    for (int64_t r = 0; r < M; ++r) pairs[k * M + r] = source[r * (K / 2) + k];
  at::Tensor out = at::empty({M, N}, x.options());
  auto weights = records.contiguous();
  at::parallel_for(0, N / 32, 2, [&](int64_t begin, int64_t end) {
    auto run = size == Q4_RECORD ? row_pairs<Q4_RECORD, dequantise_q4> : row_pairs<Q8_RECORD, dequantise_q8>;
    run(pairs, M, K, weights.data_ptr<uint8_t>(), out.data_ptr<c10::BFloat16>(), N, begin, end);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &amx_mm); }
