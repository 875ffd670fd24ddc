/* quantize.h: `./run MODEL.bin -m quantize --dtype q8|q4 -o OUT.bin [--group-size N] [--threads N]`
 * (./run -m quantize --help): an f32 or bf16 checkpoint rewritten with its matrices in q8 or q4,
 * byte for byte the file `export.py --dtype q8|q4` writes from the model's Hugging Face folder
 * (model.h describes the format); norm weights and biases stay float32. The output is written
 * under a temporary name in its folder, synced and renamed at the end: a failure or Ctrl-C leaves
 * no file behind, and the temporary of a run killed outright goes at the next run to that name.
 * With --stream instead of MODEL.bin and -o, matrices' rows come on standard input and their
 * quantised row blocks go to standard output: export.py's way (quantize.c has the frames). */
#ifndef QUANTIZE_H
#define QUANTIZE_H

/* Runs the mode on the whole command line. Returns 0; any error is one line on stderr
 * ("run: error: ...") and exit status 1, with no output file left behind. */
int quantize_main(int argc, char** argv);

#endif
