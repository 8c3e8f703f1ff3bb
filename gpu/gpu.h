/* GPU runtime queries behind a plain-C header; the build without CUDA answers "no device".
 *
 * Conventions of every gpu/ op (see docs/gpu.md): `kvedge_gpu_<op>(args, stream)` launches the
 * CUDA kernel on a stream and returns without waiting; `kvedge_cpu_<op>(args)` is the CPU
 * reference with the same argument struct and is the production path without a device. Both
 * check every argument on the host first and write nothing when one is bad.
 *
 * Errors of the kvedge_gpu_* entry points, beyond each op's argument errors:
 *   KVEDGE_EINVAL  built without CUDA, no usable device, or the runtime refused an argument;
 *   KVEDGE_ENOMEM  device memory exhausted;
 *   KVEDGE_EIO     any other CUDA error (launch failure, a kernel fault earlier on the stream).
 * A failed launch never aborts the process. */
#ifndef KVEDGE_GPU_GPU_H
#define KVEDGE_GPU_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA stream (cudaStream_t in the CUDA build, a token in the CPU build); NULL is the
 * default stream. Made by kvedge_gpu_stream_new in gpu/stage.h. */
typedef struct kvedge_gpu_stream_s *kvedge_gpu_stream_t;

/* Number of usable CUDA devices: 0 when kvedge was built without CUDA, when no driver is
 * loaded or when no device is present. Never fails. */
int kvedge_gpu_device_count(void);

/* 1 if this build contains the CUDA kernels, else 0. */
int kvedge_gpu_built_with_cuda(void);

#ifdef __cplusplus
}
#endif
#endif
