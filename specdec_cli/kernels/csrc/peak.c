/*
 * peak.c: the vector paths' arithmetic peak, cpu_peak(path, seconds): multiply-adds a second of one thread running
 * only the path's multiplying instruction on registers, in independent chains: vpdpbusd on 512 or 256 bits (64 or
 * 32 multiply-adds), or AVX2's vpmaddubsw (32). The benchmark's efficiency divides by this.
 * Not here: any kernel (nothing here touches memory); the portable path has no peak (../_cpu.c refuses it).
 */
#include "kernels.h"

#if HAVE_X86
#define PEAK_ACCUMULATORS 12
VNNI512 static double peak_512(long rounds)
{
    __m512i acc[PEAK_ACCUMULATORS], a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(2);
    for (int i = 0; i < PEAK_ACCUMULATORS; i++)
        acc[i] = _mm512_set1_epi32(i);
    for (long n = 0; n < rounds; n++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_ACCUMULATORS; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        __asm__ volatile("" : "+v"(a));
    }
    __m512i sum = acc[0];
    for (int i = 1; i < PEAK_ACCUMULATORS; i++)
        sum = _mm512_add_epi32(sum, acc[i]);
    return (double)_mm512_reduce_add_epi32(sum) * 0 + 64.0 * PEAK_ACCUMULATORS * (double)rounds;
}

/* vpdpbusd on 256 bits, in the encoding V the avxvnni path runs (kernels.h's vnni_dot) */
AVX2 static inline __attribute__((always_inline)) double peak_avxvnni(long rounds, const int V)
{
    __m256i acc[PEAK_ACCUMULATORS], a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(2);
    for (int i = 0; i < PEAK_ACCUMULATORS; i++)
        acc[i] = _mm256_set1_epi32(i);
    for (long n = 0; n < rounds; n++) {
        _Pragma("GCC unroll 12") for (int i = 0; i < PEAK_ACCUMULATORS; i++) acc[i] = vnni_dot(acc[i], a, b, V);
        __asm__ volatile("" : "+x"(a));
    }
    __m256i sum = acc[0]; /* every chain's result is used, so none is dropped as dead code */
    for (int i = 1; i < PEAK_ACCUMULATORS; i++)
        sum = _mm256_add_epi32(sum, acc[i]);
    volatile int sink = hsum8i(sum);
    (void)sink;
    return 32.0 * PEAK_ACCUMULATORS * (double)rounds;
}

AVX2 static double peak_vex(long rounds)
{
    return peak_avxvnni(rounds, VNNI_VEX);
}

AVX2 static double peak_evex(long rounds)
{
    return peak_avxvnni(rounds, VNNI_EVEX);
}

AVX2 static double peak_avx2(long rounds)
{
    /* vpmaddubsw alone (32 multiply-adds), its pairs summed in 16 bits: eight chains, each its own operand */
    __m256i b = _mm256_set1_epi8(2);
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3), a3 = _mm256_set1_epi8(4),
            a4 = _mm256_set1_epi8(5), a5 = _mm256_set1_epi8(6), a6 = _mm256_set1_epi8(7), a7 = _mm256_set1_epi8(8);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
#define PEAK_STEP(A, C) C = _mm256_add_epi16(C, _mm256_maddubs_epi16(A, b))
    for (long n = 0; n < rounds; n++) {
        PEAK_STEP(a0, c0);
        PEAK_STEP(a1, c1);
        PEAK_STEP(a2, c2);
        PEAK_STEP(a3, c3);
        PEAK_STEP(a4, c4);
        PEAK_STEP(a5, c5);
        PEAK_STEP(a6, c6);
        PEAK_STEP(a7, c7);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7));
    }
#undef PEAK_STEP
    __m256i sum = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(c0, c1), _mm256_add_epi16(c2, c3)),
                                   _mm256_add_epi16(_mm256_add_epi16(c4, c5), _mm256_add_epi16(c6, c7)));
    volatile int sink = hsum8i(sum);
    (void)sink;
    return 32.0 * 8 * (double)rounds;
}

/* The best rate of repeated 20,000-round runs for `seconds`, on a vector path. */
double cpu_peak(int path, double seconds)
{
    double best = 0.0;
    double stop = cpu_now_seconds() + seconds;
    while (cpu_now_seconds() < stop) {
        double start = cpu_now_seconds(), macs;
        long rounds = 20000;
        if (path == ISA_AVXVNNI)
            macs = cpu_avxvnni_encoding == VNNI_EVEX ? peak_evex(rounds) : peak_vex(rounds);
        else
            macs = path == ISA_AVX512VNNI ? peak_512(rounds) : peak_avx2(rounds);
        double rate = macs / (cpu_now_seconds() - start);
        best = rate > best ? rate : best;
    }
    return best;
}
#else /* no vector path on this CPU, and no peak */
double cpu_peak(int path, double seconds)
{
    (void)path;
    (void)seconds;
    return 0.0;
}
#endif
