/* Which driver calls does a stream capture forbid, on this driver? Run on an H100
 * (driver 580.159.04) on 2026-11-24; its output is docs/gpu/capture_rules.txt.
 * Build: gcc -O1 -o probe capture_probe.c -I/usr/local/cuda/include
 *        -L/usr/local/cuda/lib64/stubs -lcuda -lpthread */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
static CUstream s, s2; static CUdeviceptr buf; static CUcontext ctx; static CUdevice dev;
static CUevent ev;
static int probe(int which, int *rc) {
  CUresult r = CUDA_SUCCESS; unsigned long long id; CUdeviceptr p; CUevent e;
  switch (which) {
  case 0: r = cuStreamGetId(s, &id); break;
  case 1: r = cuStreamGetId(s2, &id); break;
  case 2: r = cuStreamGetId(CU_STREAM_LEGACY, &id); break;
  case 3: r = cuStreamGetId(CU_STREAM_PER_THREAD, &id); break;
  case 4: r = cuStreamQuery(s2); break;
  case 5: r = cuEventRecord(ev, s2); if (!r) r = cuEventQuery(ev); break;
  case 6: r = cuEventQuery(ev); break;
  case 7: r = cuMemAlloc(&p, 1 << 20); if (!r) cuMemFree(p); break;
  case 8: { CUmemGenericAllocationHandle h; CUmemAllocationProp pr; memset(&pr,0,sizeof pr);
      pr.type = CU_MEM_ALLOCATION_TYPE_PINNED; pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pr.location.id = 0;
      r = cuMemCreate(&h, 2 << 20, &pr, 0); if (!r) cuMemRelease(h); break; }
  case 9: r = cuMemAddressReserve(&p, 2 << 20, 0, 0, 0); if (!r) cuMemAddressFree(p, 2 << 20); break;
  case 10: r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING); if (!r) cuEventDestroy(e); break;
  case 11: r = cuStreamWaitEvent(s2, ev, 0); break;
  case 12: { void *h; r = cuMemHostAlloc(&h, 4096, 0); if (!r) cuMemFreeHost(h); break; }
  case 13: r = cuStreamSynchronize(s2); break;
  case 14: r = cuEventSynchronize(ev); break;
  case 15: { CUcontext c; r = cuCtxGetCurrent(&c); break; }
  case 16: { unsigned int m; r = cuPointerGetAttribute(&m, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, buf); break; }
  case 17: { CUstreamCaptureStatus st; r = cuStreamIsCapturing(s2, &st); break; }
  case 18: { CUstreamCaptureStatus st; r = cuStreamIsCapturing(CU_STREAM_LEGACY, &st); break; }
  case 19: { CUcontext c; r = cuStreamGetCtx(s2, &c); break; }
  case 20: r = cuMemsetD32Async(buf, 1, 16, s2); break;
  case 21: { CUevent e2; r = cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING); if (!r) { r = cuEventRecord(e2, s); if (!r) r = cuEventQuery(e2); } break; }
  case 22: { CUcontext c; r = cuCtxPushCurrent(ctx); if (!r) r = cuCtxPopCurrent(&c); break; }
  case 23: { CUstreamCaptureStatus st; r = cuStreamIsCapturing(CU_STREAM_PER_THREAD, &st); break; }
  case 24: r = cuStreamQuery(CU_STREAM_PER_THREAD); break;
  case 25: { size_t f, t; r = cuMemGetInfo(&f, &t); break; }
  }
  *rc = r; return 0;
}
static const char *names[] = {"GetId(capturing)","GetId(other)","GetId(legacy)","GetId(per-thread)",
 "StreamQuery(other)","EventRecord+Query(other)","EventQuery(old ev)","MemAlloc+Free","MemCreate+Release",
 "AddressReserve+Free","EventCreate+Destroy","StreamWaitEvent(other)","MemHostAlloc+FreeHost",
 "StreamSync(other)","EventSync(old ev)","CtxGetCurrent","PointerGetAttribute","IsCapturing(other)",
 "IsCapturing(legacy)","StreamGetCtx(other)","MemsetAsync(other)","EventRecord+Query(capturing)",
 "CtxPush+Pop","IsCapturing(per-thread)","StreamQuery(per-thread)","MemGetInfo"};
#define NP 26
static int which_g, rc_g;
static void *th(void *a) { (void)a; cuCtxSetCurrent(ctx); probe(which_g, &rc_g); return NULL; }
int main(void) {
  cuInit(0); cuDeviceGet(&dev, 0); cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING); cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING);
  cuMemAlloc(&buf, 1 << 20); cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING); cuEventRecord(ev, s2);
  cuCtxSynchronize();
  const char *mn[] = {"global", "thread_local", "relaxed"};
  CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_RELAXED};
  for (int m = 0; m < 3; m++)
    for (int other = 0; other < 2; other++)
      for (int w = 0; w < NP; w++) {
        CUresult b = cuStreamBeginCapture(s, modes[m]);
        cuMemsetD32Async(buf, 7, 16, s);
        int rc = -1;
        if (other) { which_g = w; pthread_t t; pthread_create(&t, NULL, th, NULL); pthread_join(t, NULL); rc = rc_g; }
        else probe(w, &rc);
        CUgraph gr = NULL; CUresult e = cuStreamEndCapture(s, &gr);
        if (gr) cuGraphDestroy(gr);
        const char *es = "?"; if (rc) cuGetErrorName((CUresult)rc, &es);
        printf("%-12s %-6s %-28s rc=%3d %-40s begin=%d end=%d%s\n", mn[m], other ? "other" : "same", names[w], rc, rc ? es : "",
               b, e, e ? " (capture invalidated)" : "");
        cuCtxSynchronize();
      }
  return 0;
}
