/*
 * fuselet core: the framework-free C ABI shared by every kernel family.
 *
 * Conventions (every entry point follows them):
 *   - Functions return a fuselet_status. FUSELET_OK means success; on any other value
 *     fuselet_last_error() returns a message naming the offending argument. No C++
 *     exception ever crosses this boundary.
 *   - Tensors are passed as non-owning fuselet_tensor views (pointer, dtype, shape,
 *     strides in elements). The library never frees or keeps them.
 *   - CUDA entry points carry a `_cuda` suffix, take device pointers and a `stream`
 *     (a cudaStream_t passed as void*, NULL = legacy default stream), and launch
 *     asynchronously on that stream. They check cudaGetLastError() after every launch.
 *   - Kernels accumulate in float32 whatever the storage dtype.
 *   - A refused dtype's message reads "<argument>: expected dtype ..."; every other refusal
 *     reads "<argument>: ..." too, without those words (a binding may raise its type error
 *     for the first kind and its value error for the second).
 *   - Each entry point has a `_check` function beside it (fuselet_rms_norm_fwd_check, ...)
 *     that takes its inputs and options only (not its outputs, workspace or stream) and runs
 *     the same checks of them as the entry point, host and `_cuda` alike, with the same
 *     messages: FUSELET_OK, or FUSELET_ERR_INVALID_ARGUMENT with fuselet_last_error() naming
 *     the argument. It reads no tensor data (`data` may be NULL) and writes nothing. A `_check`
 *     accepts any strides >= 0 (within the bounds of fuselet_tensor below), where the entry
 *     point also needs the layout its kernels read (its header says which: a last dim of
 *     stride 1, rows of one stride, contiguous vectors) and non-NULL data: a framework binding
 *     checks the views of its inputs as they are, before it copies them into that layout (a
 *     stride-0 or strided view of billions of elements is refused before it is copied). The
 *     entry point then checks its own outputs and the layout, and what depends on the data
 *     (cross-entropy's class ids) or on the device (the `_cuda` entry points' alignment).
 */
#ifndef FUSELET_FUSELET_H_
#define FUSELET_FUSELET_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FUSELET_API __declspec(dllexport)
#else
#define FUSELET_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Result of every fuselet call. */
typedef enum fuselet_status {
  FUSELET_OK = 0,
  FUSELET_ERR_INVALID_ARGUMENT = 1, /* bad dtype, shape, stride, scalar or pointer */
  FUSELET_ERR_UNSUPPORTED = 2,      /* valid request this build cannot serve (e.g. no CUDA) */
  FUSELET_ERR_CUDA = 3,             /* a CUDA runtime call or kernel launch failed */
  FUSELET_ERR_INTERNAL = 4          /* out of memory or a bug: please report */
} fuselet_status;

/*
 * Element types of tensor views. The integer types are class ids: only the `target` of the
 * cross-entropy entry points (cross_entropy.h) takes them; every other tensor argument of
 * every entry point must be one of the three float types (FUSELET_ERR_INVALID_ARGUMENT).
 */
typedef enum fuselet_dtype {
  FUSELET_FLOAT32 = 0,
  FUSELET_FLOAT16 = 1,
  FUSELET_BFLOAT16 = 2,
  FUSELET_INT32 = 3,
  FUSELET_INT64 = 4
} fuselet_dtype;

#define FUSELET_MAX_DIMS 8

/*
 * Non-owning view of a strided tensor.
 *   data:    first element (host or device memory, as the entry point says)
 *   dtype:   element type
 *   ndim:    number of dimensions, 0..FUSELET_MAX_DIMS
 *   shape:   extent of each dimension (only the first ndim entries are read), >= 0
 *   strides: step between neighbours of each dimension, in ELEMENTS, not bytes
 * Every entry point checks what a view claims before it touches memory, and refuses with
 * FUSELET_ERR_INVALID_ARGUMENT, naming the argument:
 *   - negative strides (a reversed view such as numpy's a[::-1]): not supported; make the
 *     tensor contiguous first. The stride of a dimension of size 1 is never used, so any
 *     value is accepted there, and a view of no elements takes any strides;
 *   - a number of elements (the product of the shape) that overflows int64;
 *   - a span that does not fit: the offset of its last byte, (sum over the dimensions of
 *     (size - 1) x stride + 1) x the element size, must fit in int64 (and in ptrdiff_t).
 * The checks cannot know how much memory lies behind `data`: a view within these bounds
 * must still point at memory that holds it.
 */
typedef struct fuselet_tensor {
  void* data;
  fuselet_dtype dtype;
  int32_t ndim;
  int64_t shape[FUSELET_MAX_DIMS];
  int64_t strides[FUSELET_MAX_DIMS];
} fuselet_tensor;

/* Message of the last failed call on this thread ("" if none). Valid until the next call. */
FUSELET_API const char* fuselet_last_error(void);

/* Human-readable name of a status code. */
FUSELET_API const char* fuselet_status_string(fuselet_status status);

/* Library version, "MAJOR.MINOR.PATCH". */
FUSELET_API const char* fuselet_version(void);

/* 1 if this libfuselet was compiled with its CUDA kernels, else 0. */
FUSELET_API int fuselet_has_cuda(void);

/* Semicolon-separated CUDA architectures compiled in ("" for CPU-only builds). */
FUSELET_API const char* fuselet_cuda_archs(void);

/*
 * Instruction set the CPU kernels use: "avx512" (AVX-512 F/BW/VL/DQ), "avx2" (AVX2 + FMA +
 * F16C) or "baseline" (x86-64 SSE2, and every non-x86 CPU). Default: the best this CPU has,
 * chosen once by CPUID. The FUSELET_CPU_ISA environment variable (baseline, avx2 or avx512)
 * picks a lower one; one the CPU lacks is clamped to the best it has, with a warning on
 * stderr; FUSELET_CPU_BASELINE=1 is the same as FUSELET_CPU_ISA=baseline. An unknown value
 * makes this return NULL and every CPU kernel fail with FUSELET_ERR_INVALID_ARGUMENT
 * (fuselet_last_error() names the variable and the values it takes). All give bit-identical
 * results.
 */
FUSELET_API const char* fuselet_cpu_isa(void);

/*
 * Overrides the instruction set of the CPU kernels for the whole process (tests and
 * benchmarks compare them): a name as above, or NULL to return to the default.
 * FUSELET_ERR_INVALID_ARGUMENT for an unknown name, FUSELET_ERR_UNSUPPORTED for one this CPU
 * lacks. Not to be called while CPU kernels run on other threads.
 */
FUSELET_API fuselet_status fuselet_set_cpu_isa(const char* isa);

/*
 * Number of threads the CPU kernels use, at most FUSELET_MAX_THREADS. Default: the
 * FUSELET_NUM_THREADS environment variable if set to a positive integer (a larger one than
 * FUSELET_MAX_THREADS is clamped to it, with one warning on stderr), else the number of
 * hardware threads (likewise at most FUSELET_MAX_THREADS). fuselet_set_num_threads(n) with
 * 1 <= n <= FUSELET_MAX_THREADS overrides it; any other n is FUSELET_ERR_INVALID_ARGUMENT.
 * The pool of n - 1 worker threads starts on the first kernel that splits its rows; if the
 * system refuses to start them (a thread limit), the kernels still run, on the pool already
 * running or else on the calling thread alone, with one warning on stderr.
 */
#define FUSELET_MAX_THREADS 1024
FUSELET_API int fuselet_get_num_threads(void);
FUSELET_API fuselet_status fuselet_set_num_threads(int n);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FUSELET_FUSELET_H_ */
