// diversed::amx_mm: rows [M, K] bf16 times a GGUF-quantised weight [N, K] -> [M, N] bf16, with Intel AMX.
//
// The weight streams as stored: 4-bit codes (Q4_0/Q4_1 projections) or 8-bit ones (a Q8_0 LM head). Per
// block of 16 output rows x 32 inputs the codes become the exact bf16 weights (d·q + m rounded once, as the
// dense bf16 model holds them), and AMX tile products multiply them by up to 16 rows at once. The codes are
// unpacked once whatever M is (beyond 16 rows, into a buffer reused for every 16), so a pass over 8 tokens
// costs about what a pass over one does and a prompt's costs mostly its products; every output element is
// computed the same way whatever M is, so a row's result does not depend on the rows beside it.
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

#include <algorithm>
#include <cstdlib>
#include <new>
#include <vector>

#define FENCE asm volatile("" ::: "memory")  // GCC's tile intrinsics declare no memory operands

namespace {

constexpr int Q4_RECORD = 320, Q8_RECORD = 544;
constexpr int AHEAD = 4;  // blocks prefetched ahead

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Up to 16 rows, tiles 0, 1: the outputs of two row groups (16 x M fp32); 2, 3: their weights (16 rows x
// 32 bf16); 4: the rows' inputs for one block, in AMX's pair layout (16 input pairs x M). More rows: every
// tile 16 x 64 bytes (0-3 outputs, 4-5 weights, 6-7 inputs).
void configure(int64_t M) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = (M > 16 || t == 2 || t == 3) ? 64 : 4 * M;
  _tile_loadconfig(&cfg);
}

template <typename T>
struct Aligned {  // a cache-line-aligned allocator: the kernel's stores of weights are aligned
  using value_type = T;
  Aligned() = default;
  template <typename U>
  Aligned(const Aligned<U>&) {}
  T* allocate(size_t n) {
    if (void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)) return (T*)p;
    throw std::bad_alloc();
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const Aligned&) const { return true; }
};

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

// Tile TILE's results (16 output columns x `count` rows, stored [16][stride] fp32) into `out`'s rows.
template <int TILE>
inline void write_outputs(float* results, int64_t stride, int64_t count, c10::BFloat16* out, int64_t N) {
  if constexpr (TILE == 0) _tile_stored(0, results, 4 * stride);  // the intrinsic names its tile literally
  else if constexpr (TILE == 1) _tile_stored(1, results, 4 * stride);
  else if constexpr (TILE == 2) _tile_stored(2, results, 4 * stride);
  else _tile_stored(3, results, 4 * stride);
  FENCE;
  const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i column = _mm512_mullo_epi32(lanes, _mm512_set1_epi32(stride));
  for (int64_t r = 0; r < count; ++r) {
    __m512 values = _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32(r)), results, 4);
    _mm256_storeu_si256((__m256i*)(out + r * N), (__m256i)_mm512_cvtneps_pbh(values));
  }
}

inline void prefetch_ahead(const uint8_t* record, int record_bytes) {
  for (int line = 0; line < 2 * record_bytes; line += 64)
    _mm_prefetch((const char*)(record + AHEAD * 2 * record_bytes + line), _MM_HINT_T0);
}

// Output columns [32 p0, 32 p1) for M <= 16 rows (inputs [K/2][M]): each block's codes become weights and
// are multiplied at once, so the weights stream through and the rows cost almost nothing.
template <int RECORD, void (*dequantise)(const uint8_t*, uint16_t*)>
void few_rows(const uint32_t* inputs, int64_t M, int64_t K, const uint8_t* records, c10::BFloat16* out,
              int64_t N, int64_t p0, int64_t p1) {
  configure(M);
  const int64_t blocks = K / 32;
  alignas(64) uint16_t weights[2][16 * 32];
  alignas(64) float results[16 * 16];
  for (int64_t p = p0; p < p1; ++p) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* record = records + (p * blocks + b) * 2 * RECORD;
      prefetch_ahead(record, RECORD);
      _tile_loadd(4, inputs + b * 16 * M, 4 * M);
      dequantise(record, weights[0]);
      dequantise(record + RECORD, weights[1]);
      FENCE;
      _tile_loadd(2, weights[0], 64);
      _tile_loadd(3, weights[1], 64);
      _tile_dpbf16ps(0, 2, 4);
      _tile_dpbf16ps(1, 3, 4);
    }
    write_outputs<0>(results, M, M, out + 2 * p * 16, N);
    write_outputs<1>(results, M, M, out + (2 * p + 1) * 16, N);
  }
  _tile_release();
}

// The same for M > 16 rows (inputs [ceil(M/16) chunks][K/2][16], zero-padded). A row pair's blocks become weights
// once, as the first two chunks are multiplied, into a buffer the caches keep for the later chunks. Each
// block's two weight tiles multiply two chunks at a time: four accumulators amortise the tile loads and
// hide the products' latency.
template <int RECORD, void (*dequantise)(const uint8_t*, uint16_t*)>
void many_rows(const uint32_t* inputs, int64_t M, int64_t K, const uint8_t* records, c10::BFloat16* out,
               int64_t N, int64_t p0, int64_t p1) {
  configure(16);
  const int64_t blocks = K / 32, chunks = (M + 15) / 16, stride = K / 2 * 16;
  thread_local std::vector<uint16_t, Aligned<uint16_t>> buffer;
  buffer.resize(blocks * 2 * 512);
  uint16_t* weights = buffer.data();
  alignas(64) float results[16 * 16];
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t chunk = 0; chunk < chunks; chunk += 2) {
      const uint32_t* first = inputs + chunk * stride;
      const uint32_t* second = chunk + 1 < chunks ? first + stride : first;  // an odd last chunk: twice
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t b = 0; b < blocks; ++b) {
        if (chunk == 0) {  // the first chunks convert the blocks as they go, so conversions and products overlap
          const uint8_t* record = records + (p * blocks + b) * 2 * RECORD;
          prefetch_ahead(record, RECORD);
          dequantise(record, weights + 2 * b * 512);
          dequantise(record + RECORD, weights + (2 * b + 1) * 512);
          FENCE;
        }
        _tile_loadd(4, weights + 2 * b * 512, 64);
        _tile_loadd(5, weights + (2 * b + 1) * 512, 64);
        _tile_loadd(6, first + b * 256, 64);
        _tile_loadd(7, second + b * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      c10::BFloat16* rows = out + 16 * chunk * N + 2 * p * 16;
      const int64_t count = std::min<int64_t>(16, M - 16 * chunk);
      write_outputs<0>(results, 16, count, rows, N);
      write_outputs<1>(results, 16, count, rows + 16, N);
      if (chunk + 1 < chunks) {
        const int64_t rest = std::min<int64_t>(16, M - 16 * (chunk + 1));
        write_outputs<2>(results, 16, rest, rows + 16 * N, N);
        write_outputs<3>(results, 16, rest, rows + 16 * N + 16, N);
      }
    }
  }
  _tile_release();
}

// The rows in AMX's pair layout: [chunks][K/2][width] 32-bit pairs of inputs, width = M up to 16 rows,
// else 16 with the last chunk zero-padded.
at::Tensor input_pairs(const at::Tensor& rows) {
  const int64_t M = rows.size(0), K = rows.size(1);
  const int64_t width = std::min<int64_t>(M, 16), chunks = (M + 15) / 16;
  at::Tensor x = rows.contiguous();
  at::Tensor pairs = at::empty({chunks, K / 2, width}, x.options().dtype(at::kInt));
  auto source = (const uint32_t*)x.data_ptr();
  auto target = (uint32_t*)pairs.data_ptr();
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h)
      for (int64_t k = 0; k < K / 2; ++k)
        for (int64_t j = 0; j < width; ++j) {
          const int64_t r = h * width + j;
          target[(h * (K / 2) + k) * width + j] = r < M ? source[r * (K / 2) + k] : 0;
        }
  });
  return pairs;
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
  TORCH_CHECK(M >= 1 && K == records.size(1) * 32, "rows of the weight's input width");
  at::Tensor pairs = input_pairs(rows);
  at::Tensor out = at::empty({M, N}, rows.options());
  auto weights = records.contiguous();
  at::parallel_for(0, N / 32, 2, [&](int64_t begin, int64_t end) {
    auto inputs = (const uint32_t*)pairs.data_ptr();
    auto codes = weights.data_ptr<uint8_t>();
    auto outputs = out.data_ptr<c10::BFloat16>();
    if (M <= 16) {
      auto run = size == Q4_RECORD ? few_rows<Q4_RECORD, dequantise_q4> : few_rows<Q8_RECORD, dequantise_q8>;
      run(inputs, M, K, codes, outputs, N, begin, end);
    } else {
      auto run = size == Q4_RECORD ? many_rows<Q4_RECORD, dequantise_q4> : many_rows<Q8_RECORD, dequantise_q8>;
      run(inputs, M, K, codes, outputs, N, begin, end);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(diversed, m) { m.def("amx_mm(Tensor rows, Tensor records) -> Tensor"); }
TORCH_LIBRARY_IMPL(diversed, CPU, m) { m.impl("amx_mm", &amx_mm); }
