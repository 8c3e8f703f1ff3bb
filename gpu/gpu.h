/* GPU runtime queries behind a plain-C header; the build without CUDA answers "no device". */
#ifndef KVEDGE_GPU_GPU_H
#define KVEDGE_GPU_GPU_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices: 0 when kvedge was built without CUDA, when no driver is
 * loaded or when no device is present. Never fails. */
int kvedge_gpu_device_count(void);

/* 1 if this build contains the CUDA kernels, else 0. */
int kvedge_gpu_built_with_cuda(void);

#ifdef __cplusplus
}
#endif
#endif
