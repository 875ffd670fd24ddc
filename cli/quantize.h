/* quantize.h: `./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin`, the checkpoint quantiser.
 *
 * Reads an f32 or bf16 checkpoint (mapped and validated by the loader, model.c) and writes the
 * same model with its matrices in q8 or q4: byte for byte the file that `export.py --dtype q8|q4`
 * writes from the Hugging Face folder the checkpoint came from (the same header, tokenizer
 * section, scales, rounding and row blocks; model.h describes the format). Norm weights and biases
 * stay float32. The rows are quantised on the kernel threads and the output is written under a
 * temporary name in the output's folder, synced and renamed at the end: a failure or Ctrl-C
 * leaves no file behind.
 *
 *   --dtype q8|q4       the stored format (required)
 *   -o, --output PATH   the file to write (required; not the input)
 *   --group-size N      q8's group size, a power of two >= 8 (default 64; halved while it does not
 *                       divide every matrix width, as export.py chooses it); q4's groups are 32
 *   --threads N         threads (default: one per online CPU)
 */
#ifndef QUANTIZE_H
#define QUANTIZE_H

/* 1 when argv selects this mode (-m quantize, --mode quantize or --mode=quantize). */
int quantize_requested(int argc, char** argv);

/* Runs the mode on the whole command line. Returns 0; any error is one line on stderr
 * ("run: error: ...") and exit status 1, with no output file left behind. */
int quantize_main(int argc, char** argv);

#endif
