/* peak.h: the bench's compute roof (peak.c). */
#ifndef PEAK_H
#define PEAK_H

#include "kernels/ops.h"

/* Operations per second (a multiply-add is two) of the instruction that prefill of weight type
 * `type` relies on, measured on every thread of o for about `seconds`; *instruction names it. 0
 * where there is none to measure: the reference build, or on_amx (prefill runs a product on AMX
 * tiles). */
double peak_ops(const Ops* o, WeightType type, int on_amx, double seconds, const char** instruction);

#endif
