/* Machine code for the C test hosts, emitted for the architecture they are
 * built for: one header per architecture, each with the same functions. */
#ifndef JITMAP_TEST_ARCH_H
#define JITMAP_TEST_ARCH_H

#if defined(__x86_64__)
#include "arch_x86_64.h"
#elif defined(__aarch64__)
#include "arch_aarch64.h"
#else
#error "the C test hosts emit x86-64 or aarch64 code"
#endif

#endif
