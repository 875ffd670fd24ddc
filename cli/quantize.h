/* quantize.h: `./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin [--group-size N] [--threads N]`,
 * the checkpoint quantiser (its options: ./run -m quantize --help).
 *
 * Reads an f32 or bf16 checkpoint (mapped and validated by the loader, model.c) and writes the
 * same model with its matrices in q8 or q4: byte for byte the file that `export.py --dtype q8|q4`
 * writes from the Hugging Face folder the checkpoint came from (the same header, tokenizer
 * section, scales, rounding and row blocks; model.h describes the format). Norm weights and biases
 * stay float32. The output is written under a temporary name in its folder, synced and renamed at
 * the end: a failure or Ctrl-C leaves no file behind.
 */
#ifndef QUANTIZE_H
#define QUANTIZE_H

/* 1 when argv selects this mode (-m quantize, --mode quantize or --mode=quantize). */
int quantize_requested(int argc, char** argv);

/* Runs the mode on the whole command line. Returns 0; any error is one line on stderr
 * ("run: error: ...") and exit status 1, with no output file left behind. */
int quantize_main(int argc, char** argv);

#endif
