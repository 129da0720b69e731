/* What the C test hosts share: CHECK(call) stops the program, with the
 * status's name and the last error message, when a call fails. */
#ifndef JITMAP_TEST_CHECK_H
#define JITMAP_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "jitmap.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        jitmap_status s_ = (call);                                             \
        if (s_ != JITMAP_STATUS_OK) {                                          \
            const char *m_ = jitmap_last_error_message();                      \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call, \
                    jitmap_status_name(s_), m_ ? m_ : "");                     \
            exit(2);                                                           \
        }                                                                      \
    } while (0)

#endif
