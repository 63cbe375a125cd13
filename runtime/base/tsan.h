/* ThreadSanitizer annotations, in one place (see shared ck-notes): TSan cannot
 * see ck's inline-asm atomics, so an object handed from one thread to another
 * through a ck structure is released before it is published and acquired
 * after it is taken. Without TSan these compile to nothing. */
#ifndef GMA_TSAN_H
#define GMA_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define GMA__TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define GMA__TSAN 1
#endif
#endif

#ifdef GMA__TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define gma__tsan_release(obj) __tsan_release((void *)(obj))
#define gma__tsan_acquire(obj) __tsan_acquire((void *)(obj))
#else
#define gma__tsan_release(obj) ((void)0)
#define gma__tsan_acquire(obj) ((void)0)
#endif

#endif /* GMA_TSAN_H */
